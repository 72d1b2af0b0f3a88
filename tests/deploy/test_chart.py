"""The Helm chart: lint, render every scenario, validate the manifests, and check what they promise.

Scenarios are helm/sidecar/ci/*.yaml. Rendering uses the real helm binary (see chart.py).
"""

from __future__ import annotations

import base64
import os
import re
import shlex
from collections.abc import Mapping, Sequence
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from sidecar.config import SidecarConfig, load_config
from tests.deploy.chart import (
    CHART,
    KUBE_VERSION,
    NAMESPACE,
    RELEASE,
    by_kind,
    one,
    render,
    run_helm,
    scenarios,
    template_args,
)
from tests.deploy.kube import validation_errors
from tests.deploy.values_schema import secret_config_paths

SCENARIOS = scenarios()


def scenario(name: str) -> Path:
    return CHART / "ci" / f"{name}-values.yaml"


@cache
def rendered(path: Path) -> tuple[dict[str, Any], ...]:
    return tuple(render([path]))


def ids(p: Path) -> str:
    return p.stem.removesuffix("-values")


def test_every_documented_scenario_exists() -> None:
    assert [ids(p) for p in SCENARIOS] == [
        "default", "e2e-alerts", "existing-secret", "full", "in-pod-podmonitor", "in-pod", "keda-cap", "otel",
        "secure",
    ]  # fmt: skip


@pytest.mark.parametrize("path", SCENARIOS, ids=ids)
def test_helm_lint_strict(helm: str, path: Path) -> None:
    proc = run_helm("lint", "--strict", str(CHART), "--values", str(path), check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "[WARNING]" not in proc.stdout and "[ERROR]" not in proc.stdout, proc.stdout


@pytest.mark.parametrize("path", SCENARIOS, ids=ids)
def test_rendered_manifests_are_valid(helm: str, path: Path) -> None:
    docs = rendered(path)
    assert docs
    problems = {f"{d['kind']}/{d['metadata']['name']}": validation_errors(d) for d in docs}
    assert {k: v for k, v in problems.items() if v} == {}
    names = [(d["kind"], d["metadata"]["name"]) for d in docs]
    assert len(names) == len(set(names)), "two resources of one kind share a name"


def test_the_validators_catch_mistakes(helm: str) -> None:
    docs = rendered(scenario("full"))
    deployment = dict(one(docs, "Deployment", RELEASE))
    deployment["spec"] = {**deployment["spec"], "replica": 3}
    assert validation_errors(deployment)
    monitor = dict(by_kind(docs, "ServiceMonitor")[0])
    monitor["spec"] = {**monitor["spec"], "endpoint": []}
    assert validation_errors(monitor)
    scaled = dict(one(docs, "ScaledObject"))
    scaled["spec"] = {**scaled["spec"], "maxReplicaCount": "six"}
    assert validation_errors(scaled)


def secret_env(docs: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    out = {}
    for s in by_kind(docs, "Secret"):
        out.update({k: base64.b64decode(v).decode() for k, v in s.get("data", {}).items()})
    return out


def sidecar_config(docs: Sequence[Mapping[str, Any]], tmp_path: Path, extra_env: Mapping[str, str]) -> SidecarConfig:
    """The configuration a pod of this release would load: the ConfigMap's file plus the Secret's env."""
    cm = one(docs, "ConfigMap", next(d["metadata"]["name"] for d in by_kind(docs, "ConfigMap")
                                     if "sidecar.yaml" in d["data"]))  # fmt: skip
    path = tmp_path / "sidecar.yaml"
    path.write_text(cm["data"]["sidecar.yaml"])
    os.environ.update({**secret_env(docs), **extra_env})
    return load_config(path)


@pytest.mark.parametrize("path", SCENARIOS, ids=ids)
def test_the_sidecar_accepts_the_rendered_configuration(
    helm: str, path: Path, tmp_path: Path, clean_environment: None
) -> None:
    docs = rendered(path)
    # existing-secret: the operator's Secret would carry the SASL password.
    extra = {"SIDECAR_KAFKA__SASL_PASSWORD": "from-existing-secret"} if "existing" in path.name else {}
    cfg = sidecar_config(docs, tmp_path, extra)
    # Standby replicas (more replicas than partitions) must stay ready.
    assert cfg.kafka.ready_requires_partitions is False
    assert cfg.http.host == "0.0.0.0"


def pod_spec(docs: Sequence[Mapping[str, Any]]) -> Mapping[str, Any]:
    spec: Mapping[str, Any] = one(docs, "Deployment", RELEASE)["spec"]["template"]["spec"]
    return spec


def container(docs: Sequence[Mapping[str, Any]]) -> Mapping[str, Any]:
    c: Mapping[str, Any] = next(c for c in pod_spec(docs)["containers"] if c["name"] == "sidecar")
    return c


def test_defaults_probes_security_and_service(helm: str) -> None:
    docs = rendered(scenario("default"))
    c = container(docs)
    port = c["ports"][0]
    assert port == {"name": "http-metrics", "containerPort": 9108, "protocol": "TCP"}
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http-metrics"}
    assert c["startupProbe"]["httpGet"] == {"path": "/healthz", "port": "http-metrics"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http-metrics"}
    assert c["args"] == ["run", "--config", "/etc/sidecar/sidecar.yaml"]
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    assert c["resources"]["limits"]["memory"]
    spec = pod_spec(docs)
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["automountServiceAccountToken"] is False
    service = one(docs, "Service")
    assert service["spec"]["publishNotReadyAddresses"] is True
    assert service["spec"]["ports"][0]["port"] == 9108
    pdb = one(docs, "PodDisruptionBudget")
    assert pdb["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
    assert pdb["spec"]["selector"]["matchLabels"] == one(docs, "Deployment")["spec"]["selector"]["matchLabels"]
    assert {d["kind"] for d in docs} == {
        "ServiceAccount", "ConfigMap", "Service", "Deployment", "PodDisruptionBudget", "Pod",  # Pod: helm test
    }  # fmt: skip


def test_http_port_follows_the_config(helm: str) -> None:
    docs = render(set_values={"config.http.port": "9200"})
    assert container(docs)["ports"][0]["containerPort"] == 9200
    assert one(docs, "Service")["spec"]["ports"][0]["port"] == 9200


def test_config_or_secret_changes_roll_the_pods(helm: str) -> None:
    def annotations(values: Mapping[str, str]) -> Mapping[str, str]:
        deployment = one(render(set_values=values), "Deployment")
        tpl: Mapping[str, str] = deployment["spec"]["template"]["metadata"]["annotations"]
        return tpl

    base = annotations({})
    assert annotations({"config.state.idle_ttl_seconds": "600"})["checksum/config"] != base["checksum/config"]
    assert annotations({"secrets.vllmApiKey": "k"})["checksum/secret"] != base["checksum/secret"]


def test_secrets_go_to_a_secret_never_to_the_configmap(helm: str) -> None:
    docs = rendered(scenario("full"))
    env = secret_env(docs)
    assert env["SIDECAR_KAFKA__SASL_PASSWORD"] == "not-a-real-password"
    assert env["SIDECAR_KAFKA__JOURNAL_SIGNING_KEYS"] == '["first-key","previous-key"]'
    assert env["SIDECAR_ALERTING__SINKS__MQTT__PASSWORD"] == "not-a-real-password"
    assert env["SIDECAR_ALERTING__SINKS__WEBHOOK__URL"] == "https://hooks.example.com/not-a-real-token"
    for cm in by_kind(docs, "ConfigMap"):
        text = yaml.safe_dump(cm)
        for value in env.values():
            assert value not in text
    assert {"secretRef": {"name": RELEASE}} in container(docs)["envFrom"]


def test_every_secret_field_of_the_config_has_a_secret_value(helm: str) -> None:
    """The schema refuses secrets in values.config; each one has a values.secrets entry instead."""
    env = secret_env(rendered(scenario("full")))
    wanted = {"SIDECAR_" + "__".join(p.upper() for p in path.split(".")) for path in secret_config_paths()}
    assert wanted
    assert wanted <= env.keys(), wanted - env.keys()


def test_existing_secret_replaces_the_chart_secret(helm: str) -> None:
    docs = rendered(scenario("existing-secret"))
    assert by_kind(docs, "Secret") == []
    assert container(docs)["envFrom"] == [{"secretRef": {"name": "sidecar-credentials"}}]
    assert one(docs, "Deployment")["spec"]["strategy"] == {"type": "Recreate"}
    assert pod_spec(docs)["serviceAccountName"] == "monitoring"
    assert by_kind(docs, "ServiceAccount") == []


def test_no_secret_and_no_envfrom_without_secret_values(helm: str) -> None:
    docs = rendered(scenario("default"))
    assert by_kind(docs, "Secret") == []
    assert "envFrom" not in container(docs)


def test_image_reference(helm: str) -> None:
    assert container(rendered(scenario("default")))["image"] == "llm-agent-sidecar:0.1.0"
    assert container(rendered(scenario("full")))["image"] == (
        "registry.example.com/ml/llm-agent-sidecar@sha256:"
        "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
    )


def test_keda_caps_replicas_at_the_partition_count(helm: str) -> None:
    docs = rendered(scenario("keda-cap"))
    so = one(docs, "ScaledObject")
    assert so["spec"]["maxReplicaCount"] == 4  # maxReplicas 50, partitions 4
    assert so["spec"]["minReplicaCount"] == 2
    meta = so["spec"]["triggers"][0]["metadata"]
    assert meta == {
        "bootstrapServers": "kafka:9092", "consumerGroup": "llm-agent-sidecar", "topic": "agent.conversations",
        "offsetResetPolicy": "earliest", "lagThreshold": "500", "activationLagThreshold": "0",
        "allowIdleConsumers": "false",
    }  # fmt: skip
    assert so["spec"]["scaleTargetRef"]["name"] == one(docs, "Deployment")["metadata"]["name"]
    assert "replicas" not in one(docs, "Deployment")["spec"], "KEDA owns the replica count"


def test_readme_helm_template_command_works_and_its_warning_is_true(helm: str) -> None:
    """The README's plain `helm template` renders; without --kube-version, helm stops with the
    message the README quotes (so the advice stays true when the chart or helm changes)."""
    readme = (CHART / "README.md").read_text()
    block = re.search(r"```bash\n(helm template [^`]*?)```", readme)
    assert block, "the README shows no helm template command"
    argv = shlex.split(block.group(1).replace("\\\n", " "))[1:]
    argv = [str(CHART) if a == "helm/sidecar" else a for a in argv]
    assert "--kube-version" in argv
    assert "kind: Deployment" in run_helm(*argv).stdout
    i = argv.index("--kube-version")
    plain = run_helm(*argv[:i], *argv[i + 2 :], check=False)
    assert plain.returncode != 0
    quoted = re.search(r'stop with "([^"]+)"', readme.replace("\n", " "))
    assert quoted and quoted.group(1) in plain.stderr, plain.stderr


def test_keda_scales_down_slowly_and_falls_back_when_blind(helm: str) -> None:
    """cooldownPeriod only acts when scaling to zero, which minReplicas >= 1 rules out: the scale
    down is paced by the HPA's behaviour, and a fallback holds replicas while the lag is unreadable."""
    spec = one(rendered(scenario("keda-cap")), "ScaledObject")["spec"]
    assert "cooldownPeriod" not in spec
    down = spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]["scaleDown"]
    assert down["stabilizationWindowSeconds"] == 600
    assert down["policies"] == [{"type": "Pods", "value": 1, "periodSeconds": 60}]
    assert spec["fallback"] == {"failureThreshold": 3, "replicas": 4}
    capped = one(
        render(
            set_values={
                "autoscaling.keda.enabled": "true",
                "autoscaling.keda.partitions": "2",
                "autoscaling.keda.maxReplicas": "2",
            }
        ),
        "ScaledObject",
    )["spec"]
    assert capped["fallback"]["replicas"] == 2  # never more than the partitions
    off = one(
        render(set_values={"autoscaling.keda.enabled": "true", "autoscaling.keda.fallback.enabled": "false"}),
        "ScaledObject",
    )["spec"]
    assert "fallback" not in off


def test_keda_reads_topic_and_group_from_the_sidecar_config(helm: str) -> None:
    meta = one(rendered(scenario("full")), "ScaledObject")["spec"]["triggers"][0]
    assert meta["authenticationRef"] == {"name": "kafka-sasl"}
    assert meta["metadata"]["topic"] == "agents.conversations"
    assert meta["metadata"]["consumerGroup"] == "agents-sidecar"
    assert meta["metadata"]["sasl"] == "scram_sha512"


def test_vllm_deployment(helm: str, tmp_path: Path, clean_environment: None) -> None:
    docs = rendered(scenario("full"))
    vllm = one(docs, "Deployment", f"{RELEASE}-vllm")
    spec = vllm["spec"]["template"]["spec"]
    c = spec["containers"][0]
    args = c["args"]
    assert "--enable-prefix-caching" in args
    assert "--enable-lora" in args
    i = args.index("--lora-modules")
    assert args[i + 1 : i + 3] == ["booking=/adapters/booking", "completion=/adapters/completion"]
    env = {e["name"]: e for e in c["env"]}
    assert env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"]["value"] == "True"
    assert env["VLLM_API_KEY"]["valueFrom"]["secretKeyRef"]["key"] == "SIDECAR_SCORING__VLLM__API_KEY"
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 1
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    assert mounts["adapters"] == {"name": "adapters", "mountPath": "/adapters", "readOnly": False}
    assert mounts["models"]["readOnly"] is True
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["adapters"]["persistentVolumeClaim"]["claimName"] == "adapters"
    assert volumes["shm"]["emptyDir"]["medium"] == "Memory"
    service = one(docs, "Service", f"{RELEASE}-vllm")
    assert service["spec"]["selector"] == vllm["spec"]["selector"]["matchLabels"]
    # The sidecar scores on that Service by default.
    cfg = sidecar_config(docs, tmp_path, {})
    assert cfg.scoring.vllm.base_url == f"http://{RELEASE}-vllm:8000/v1"
    assert cfg.scoring.vllm.base_model == "base"


def test_vllm_without_onboarding_keeps_adapters_read_only(helm: str) -> None:
    docs = render(
        set_values={"vllm.enabled": "true", "vllm.adapters.modules.completion": "completion",
                    "vllm.adapters.volume.persistentVolumeClaim.claimName": "adapters"}
    )  # fmt: skip
    c = one(docs, "Deployment", f"{RELEASE}-vllm")["spec"]["template"]["spec"]["containers"][0]
    assert [e["name"] for e in c["env"]] == ["HOME"]  # no runtime loading, no API key
    assert {"name": "adapters", "mountPath": "/adapters", "readOnly": True} in c["volumeMounts"]


def test_monitoring_resources(helm: str) -> None:
    docs = rendered(scenario("full"))
    monitors = {m["metadata"]["name"]: m for m in by_kind(docs, "ServiceMonitor")}
    assert set(monitors) == {RELEASE, f"{RELEASE}-vllm"}
    for m in monitors.values():
        assert m["metadata"]["labels"]["release"] == "kube-prometheus-stack"
        selected = m["spec"]["selector"]["matchLabels"]
        services = [s for s in by_kind(docs, "Service") if selected.items() <= s["metadata"]["labels"].items()]
        assert len(services) == 1
        ports = {p["name"] for p in services[0]["spec"]["ports"]}
        assert m["spec"]["endpoints"][0]["port"] in ports
    rule = one(docs, "PrometheusRule")
    alerts = {r["alert"]: r for r in rule["spec"]["groups"][0]["rules"]}
    assert "SidecarScoringBacklog" not in alerts  # disabled in this scenario
    assert alerts["SidecarCommitStalled"]["labels"] == {"severity": "critical", "team": "agents"}
    assert alerts["SidecarCommitStalled"]["annotations"]["runbook_url"] == (
        "https://git.example.com/agents/llm-agent-sidecar/-/blob/main/deploy/runbooks/SidecarCommitStalled.md"
    )
    dashboards = [d for d in by_kind(docs, "ConfigMap") if d["metadata"].get("labels", {}).get("grafana_dashboard")]
    assert len(dashboards) == 3
    assert {d["metadata"]["namespace"] for d in dashboards} == {"monitoring"}


def test_in_pod_mode_renders_no_deployment(helm: str) -> None:
    docs = rendered(scenario("in-pod"))
    kinds = {d["kind"] for d in docs}
    assert "Deployment" not in kinds and "PodDisruptionBudget" not in kinds
    assert one(docs, "Service")["spec"]["selector"] == {"app.kubernetes.io/name": "booking-agent"}
    assert {"ConfigMap", "Secret", "ServiceMonitor", "PrometheusRule"} <= kinds


def test_pod_monitor_scrapes_the_in_pod_containers_like_the_service_monitor(helm: str) -> None:
    docs = rendered(scenario("in-pod-podmonitor"))
    assert not by_kind(docs, "ServiceMonitor"), "both would scrape every sidecar container"
    monitor = one(docs, "PodMonitor", RELEASE)
    assert validation_errors(monitor) == []
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    spec = monitor["spec"]
    assert spec["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    assert spec["selector"] == {"matchLabels": {"app.kubernetes.io/name": "booking-agent", "environment": "production"}}
    (endpoint,) = spec["podMetricsEndpoints"]
    assert (endpoint["port"], endpoint["path"], endpoint["interval"]) == ("http-metrics", "/metrics", "15s")
    # The snippet's container serves the port the PodMonitor scrapes.
    sidecar = next(c for c in in_pod_snippet()["containers"] if c["name"] == "llm-agent-sidecar")
    assert endpoint["port"] in {p["name"] for p in sidecar["ports"]}
    # job first, as the ServiceMonitor's target would have it, then the values' relabelings.
    job, node = endpoint["relabelings"]
    assert job == {"action": "replace", "targetLabel": "job", "replacement": RELEASE}
    assert node["targetLabel"] == "node"
    assert endpoint["metricRelabelings"][0]["action"] == "drop"
    # SidecarDown's default matchers find the targets the PodMonitor labels.
    down = next(r for r in one(docs, "PrometheusRule")["spec"]["groups"][0]["rules"] if r.get("alert") == "SidecarDown")
    assert f'job="{RELEASE}", namespace="{NAMESPACE}"' in down["expr"]
    assert validation_errors({**monitor, "spec": {**spec, "podMetricsEndpoint": []}})


def test_pod_monitor_defaults_to_the_in_pod_selector(helm: str) -> None:
    docs = render(
        [scenario("in-pod")],
        {"serviceMonitor.enabled": "false", "podMonitor.enabled": "true"},
        ["templates/podmonitor.yaml"],
    )
    assert one(docs, "PodMonitor")["spec"]["selector"] == {"matchLabels": {"app.kubernetes.io/name": "booking-agent"}}


def in_pod_snippet() -> dict[str, Any]:
    text = (CHART / "README.md").read_text()
    block = text.split("<!-- in-pod:start -->", 1)[1].split("<!-- in-pod:end -->", 1)[0]
    body = re.search(r"```yaml\n(.*?)```", block, re.DOTALL)
    assert body is not None
    snippet: dict[str, Any] = yaml.safe_load(body.group(1))
    return snippet


def test_documented_in_pod_snippet_fits_the_in_pod_scenario(helm: str) -> None:
    docs = rendered(scenario("in-pod"))
    snippet = in_pod_snippet()
    labels = {"app.kubernetes.io/name": "booking-agent"}
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "agent", "labels": labels}, "spec": snippet}
    assert validation_errors(pod) == []
    sidecar = next(c for c in snippet["containers"] if c["name"] == "llm-agent-sidecar")
    assert "readinessProbe" not in sidecar, "the sidecar must not gate the agent pod's readiness"
    assert sidecar["args"] == container(rendered(scenario("default")))["args"]
    config_map = next(v["configMap"]["name"] for v in snippet["volumes"] if "configMap" in v)
    assert config_map in {d["metadata"]["name"] for d in by_kind(docs, "ConfigMap")}
    secret = sidecar["envFrom"][0]["secretRef"]["name"]
    assert secret in {d["metadata"]["name"] for d in by_kind(docs, "Secret")}
    port = sidecar["ports"][0]
    assert port["name"] == one(docs, "Service")["spec"]["ports"][0]["name"]


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"terminationGracePeriodSeconds": "20"}, "terminationGracePeriodSeconds=20 is too short"),
        ({"config.kafka.revoke_grace_seconds": "60"}, "= 80 s"),
        ({"mode": "inPod", "autoscaling.keda.enabled": "true", "inPod.podSelector.app": "a"}, "does not render"),
        ({"autoscaling.keda.minReplicas": "5", "autoscaling.keda.maxReplicas": "2"}, "must not exceed"),
        ({"podMonitor.enabled": "true"}, "in mode=deployment use serviceMonitor.enabled"),
        (
            {
                "mode": "inPod",
                "inPod.podSelector.app": "a",
                "podMonitor.enabled": "true",
                "serviceMonitor.enabled": "true",
            },
            "would scrape every sidecar container twice",
        ),
    ],
)
def test_template_guards(helm: str, values: dict[str, str], message: str) -> None:
    proc = run_helm(*template_args(set_values=values), check=False)
    assert proc.returncode != 0
    assert message in proc.stderr


def test_kube_version_floor(helm: str) -> None:
    args = template_args()
    args[args.index(KUBE_VERSION)] = "1.26.0"
    proc = run_helm(*args, check=False)
    assert proc.returncode != 0
    assert ">=1.27.0-0" in proc.stderr


def test_replicas_spread_over_nodes_and_zones_by_default(helm: str) -> None:
    """Two default replicas must not land on one node when another has room."""
    spec = one(rendered(scenario("default")), "Deployment")["spec"]
    spread = spec["template"]["spec"]["topologySpreadConstraints"]
    assert [(c["topologyKey"], c["whenUnsatisfiable"]) for c in spread] == [
        ("kubernetes.io/hostname", "ScheduleAnyway"), ("topology.kubernetes.io/zone", "ScheduleAnyway"),
    ]  # fmt: skip
    assert all(c["labelSelector"]["matchLabels"] == spec["selector"]["matchLabels"] for c in spread)
    own = [{"maxSkew": 2, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "DoNotSchedule",
            "labelSelector": {"matchLabels": {"a": "b"}}}]  # fmt: skip
    custom = one(render(set_values={"topologySpreadConstraints[0].maxSkew": "2",
                                    "topologySpreadConstraints[0].topologyKey": "kubernetes.io/hostname",
                                    "topologySpreadConstraints[0].whenUnsatisfiable": "DoNotSchedule",
                                    "topologySpreadConstraints[0].labelSelector.matchLabels.a": "b"}),
                 "Deployment")["spec"]["template"]["spec"]  # fmt: skip
    assert custom["topologySpreadConstraints"] == own
    off = one(render(set_values={"defaultTopologySpread": "false"}), "Deployment")["spec"]["template"]["spec"]
    assert "topologySpreadConstraints" not in off


def test_network_policies_are_optional_and_name_every_peer(helm: str) -> None:
    assert not by_kind(rendered(scenario("default")), "NetworkPolicy")
    docs = rendered(scenario("full"))
    sidecar = one(docs, "NetworkPolicy", RELEASE)["spec"]
    deployment = one(docs, "Deployment", RELEASE)
    assert sidecar["podSelector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]
    assert sidecar["policyTypes"] == ["Ingress", "Egress"]
    (scrape,) = sidecar["ingress"]
    assert scrape["ports"] == [{"port": 9108, "protocol": "TCP"}]
    tester = {"app.kubernetes.io/instance": RELEASE, "app.kubernetes.io/component": "test"}
    assert scrape["from"] == [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}},
        {"podSelector": {"matchLabels": tester}},
    ]
    test_pod = one(docs, "Pod")["metadata"]["labels"]
    assert scrape["from"][1]["podSelector"]["matchLabels"].items() <= test_pod.items()
    egress = sidecar["egress"]
    assert egress[0]["ports"] == [{"port": 53, "protocol": "UDP"}, {"port": 53, "protocol": "TCP"}]
    assert egress[1]["ports"] == [{"port": 9093, "protocol": "TCP"}]
    vllm = one(docs, "Deployment", f"{RELEASE}-vllm")["spec"]["selector"]["matchLabels"]
    assert egress[2]["to"] == [{"podSelector": {"matchLabels": vllm}}]
    assert {p["port"] for p in egress[3]["ports"]} >= {8883, 443}
    inbound = one(docs, "NetworkPolicy", f"{RELEASE}-vllm")["spec"]
    assert inbound["podSelector"]["matchLabels"] == vllm and inbound["policyTypes"] == ["Ingress"]
    own = deployment["spec"]["selector"]["matchLabels"]
    assert {"podSelector": {"matchLabels": own}} in inbound["ingress"][0]["from"]


def test_chart_metadata_and_changelog() -> None:
    """Chart.yaml names where the chart comes from and who keeps it; the chart's version has its
    CHANGELOG section, whose entries the artifacthub.io/changes annotation repeats in order."""
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["home"].startswith("https://") and chart["sources"] and chart["maintainers"]
    changelog = (CHART / "CHANGELOG.md").read_text()
    section = changelog.split(f"\n## {chart['version']}\n", 1)[1].split("\n## ", 1)[0]
    entries = re.findall(r"^- (\w+): (.*?)(?=^- |\Z)", section, re.MULTILINE | re.DOTALL)
    changes = yaml.safe_load(chart["annotations"]["artifacthub.io/changes"])
    assert [c["kind"] for c in changes] == [kind for kind, _ in entries]
