"""The chart's adapter loop (docs/adapter-loop.md): a CronJob running ``adapters maintain``, off by
default; live adapter routing in the sidecar's config with it; the guards that stop a
render the job could not work in; and the dashboard panel of the routes. Rendered by the real helm."""

from __future__ import annotations

import json
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from sidecar.config import load_config
from tests.deploy.chart import CHART, NAMESPACE, RELEASE, by_kind, one, render, run_helm, template_args
from tests.deploy.kube import validation_errors
from tests.deploy.test_pod_security import violations

CRONJOB = f"{RELEASE}-adapter-loop"
# The smallest values the loop renders with: scoring on the chart's vLLM, which loads adapters at
# run time from a shared volume.
ENABLED: dict[str, str] = {
    "adapterLoop.enabled": "true",
    "config.scoring.enabled": "true",
    "config.scoring.tokenizer.model_dir": "/models/base",
    "vllm.enabled": "true",
    "vllm.adapters.runtimeLoading": "true",
    "vllm.adapters.volume.persistentVolumeClaim.claimName": "adapters",
    "vllm.modelsVolume.persistentVolumeClaim.claimName": "models",
    "secrets.vllmApiKey": "not-a-real-key",
}


@cache
def _rendered(items: tuple[tuple[str, str], ...]) -> tuple[dict[str, Any], ...]:
    return tuple(render(set_values=dict(items)))


def rendered(values: Mapping[str, str] = {}, **more: str) -> tuple[dict[str, Any], ...]:
    return _rendered(tuple(sorted({**values, **more}.items())))


def enabled(**more: str) -> tuple[dict[str, Any], ...]:
    return rendered(ENABLED, **more)


def config_of(docs: tuple[dict[str, Any], ...]) -> dict[str, Any]:
    config: dict[str, Any] = json.loads(one(docs, "ConfigMap", RELEASE)["data"]["sidecar.yaml"])
    return config


def job_pod(docs: tuple[dict[str, Any], ...]) -> Mapping[str, Any]:
    spec: Mapping[str, Any] = one(docs, "CronJob", CRONJOB)["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    return spec


def job_container(docs: tuple[dict[str, Any], ...]) -> Mapping[str, Any]:
    (c,) = job_pod(docs)["containers"]
    container: Mapping[str, Any] = c
    return container


def flags(args: list[str], name: str) -> list[str]:
    """The values of every ``--name=value`` argument."""
    return [a.split("=", 1)[1] for a in args if a.startswith(f"--{name}=")]


def test_off_by_default(helm: str) -> None:
    docs = rendered()
    assert not by_kind(docs, "CronJob")
    # Scoring is off by default, so the config carries no routing either.
    assert "scoring" not in config_of(docs)


def test_the_cronjob_runs_maintain_one_run_at_a_time(helm: str) -> None:
    docs = enabled()
    cron = one(docs, "CronJob", CRONJOB)
    assert validation_errors(cron) == []
    spec = cron["spec"]
    assert spec["concurrencyPolicy"] == "Forbid"
    assert spec["schedule"] == "0 3 * * *"
    assert "timeZone" not in spec
    assert spec["jobTemplate"]["spec"]["backoffLimit"] == 0
    pod = job_pod(docs)
    assert pod["restartPolicy"] == "Never"
    assert pod["automountServiceAccountToken"] is False
    c = job_container(docs)
    assert c["image"] == "llm-agent-sidecar-adapters:0.1.0"
    args = c["args"]
    assert args[0] == "maintain"
    # The sidecar's own ConfigMap file, mounted where the Deployment mounts it.
    (config_path,) = flags(args, "sidecar-config")
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    assert mounts[config_path]["subPath"] == "sidecar.yaml" and mounts[config_path]["readOnly"] is True
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes[mounts[config_path]["name"]]["configMap"]["name"] == RELEASE
    deployment = one(docs, "Deployment", RELEASE)["spec"]["template"]["spec"]
    sidecar_mount = next(m for m in deployment["containers"][0]["volumeMounts"] if m["name"] == "config")
    assert sidecar_mount["mountPath"] == config_path
    # /metrics through the chart's Service, on its scrape port.
    service = one(docs, "Service", RELEASE)
    port = service["spec"]["ports"][0]["port"]
    assert flags(args, "metrics-url") == [f"http://{RELEASE}.{NAMESPACE}.svc:{port}/metrics"]
    # Promoted adapters are loaded into the chart's vLLM, through its Service.
    vllm = one(docs, "Service", f"{RELEASE}-vllm")
    assert flags(args, "vllm-url") == [f"http://{RELEASE}-vllm.{NAMESPACE}.svc:{vllm['spec']['ports'][0]['port']}"]
    assert flags(args, "work") == ["/adapters/onboarding"]
    assert flags(args, "max-drift") == ["0.3"]
    assert flags(args, "margin") == ["0"]
    assert flags(args, "base") == []


def test_the_job_sees_the_adapters_where_vllm_does(helm: str) -> None:
    docs = enabled()
    pod = job_pod(docs)
    mounts = {m["mountPath"]: m["name"] for m in job_container(docs)["volumeMounts"]}
    volumes = {v["name"]: {k: x for k, x in v.items() if k != "name"} for v in pod["volumes"]}
    assert volumes[mounts["/adapters"]] == {"persistentVolumeClaim": {"claimName": "adapters"}}
    assert volumes[mounts["/models"]] == {"persistentVolumeClaim": {"claimName": "models"}}
    assert volumes[mounts["/work"]] == {"emptyDir": {"sizeLimit": "20Gi"}}
    assert "emptyDir" in volumes[mounts["/tmp"]]
    vllm_pod = one(docs, "Deployment", f"{RELEASE}-vllm")["spec"]["template"]["spec"]
    vllm_mounts = {m["mountPath"]: m for m in vllm_pod["containers"][0]["volumeMounts"]}
    vllm_volumes = {v["name"]: {k: x for k, x in v.items() if k != "name"} for v in vllm_pod["volumes"]}
    assert vllm_volumes[vllm_mounts["/adapters"]["name"]] == volumes[mounts["/adapters"]]
    assert vllm_mounts["/adapters"]["readOnly"] is False
    # The job's caches go to the work volume (its HOME), as the root filesystem is read-only.
    env = {e["name"]: e for e in job_container(docs)["env"]}
    assert env["HOME"]["value"] == "/work"
    assert env["VLLM_API_KEY"]["valueFrom"]["secretKeyRef"] == {
        "name": RELEASE, "key": "SIDECAR_SCORING__VLLM__API_KEY", "optional": True,
    }  # fmt: skip
    assert {"secretRef": {"name": RELEASE}} in job_container(docs)["envFrom"]


def test_the_job_meets_the_restricted_profile_like_the_deployment(helm: str) -> None:
    docs = enabled()
    pod = job_pod(docs)
    assert violations(pod) == []
    deployment = one(docs, "Deployment", RELEASE)["spec"]["template"]["spec"]
    assert pod["securityContext"] == deployment["securityContext"]
    assert job_container(docs)["securityContext"] == deployment["containers"][0]["securityContext"]
    assert job_container(docs)["securityContext"]["readOnlyRootFilesystem"] is True


def test_the_job_pods_are_not_replicas(helm: str) -> None:
    """The metrics Service and the PodDisruptionBudget select the consumer pods only."""
    docs = enabled()
    labels = one(docs, "CronJob", CRONJOB)["spec"]["jobTemplate"]["spec"]["template"]["metadata"]["labels"]
    assert labels["app.kubernetes.io/component"] == "adapter-loop"
    for selector in (
        one(docs, "Service", RELEASE)["spec"]["selector"],
        one(docs, "PodDisruptionBudget", RELEASE)["spec"]["selector"]["matchLabels"],
    ):
        assert not selector.items() <= labels.items()


def test_routing_is_on_with_the_loop(helm: str, tmp_path: Path, clean_environment: None) -> None:
    docs = enabled()
    assert config_of(docs)["scoring"]["routing"] == {"enabled": True}
    path = tmp_path / "sidecar.yaml"
    path.write_text(one(docs, "ConfigMap", RELEASE)["data"]["sidecar.yaml"])
    assert load_config(path).scoring.routing.enabled is True
    # Without the loop the configured routes stay the only ones unless the values turn routing on.
    scoring_only = config_of(rendered({"config.scoring.enabled": "true"}))["scoring"]
    assert "routing" not in scoring_only
    # The values' own routing settings stay.
    topic = config_of(enabled(**{"config.scoring.routing.topic": "routes"}))
    assert topic["scoring"]["routing"] == {"enabled": True, "topic": "routes"}


def test_overrides(helm: str, tmp_path: Path) -> None:
    # A values file: `--set` hands helm fractions as strings, which the schema refuses.
    path = tmp_path / "loop-values.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "adapterLoop": {
                    "schedule": "@weekly",
                    "timeZone": "Europe/Berlin",
                    "maxDrift": 0.25,
                    "margin": 0.02,
                    "base": "/models/base",
                    "metricsUrls": ["http://a:9108/metrics", "http://b:9108/metrics"],
                    "vllmUrls": ["http://vllm-0:8000"],
                    "extraArgs": ["--agent=booking"],
                    "image": {"digest": "sha256:" + "0" * 64},
                    "activeDeadlineSeconds": 0,
                }
            }
        )
    )
    docs = tuple(render([path], set_values=ENABLED))
    cron = one(docs, "CronJob", CRONJOB)
    assert validation_errors(cron) == []
    assert cron["spec"]["schedule"] == "@weekly" and cron["spec"]["timeZone"] == "Europe/Berlin"
    assert "activeDeadlineSeconds" not in cron["spec"]["jobTemplate"]["spec"]
    c = job_container(docs)
    assert c["image"] == "llm-agent-sidecar-adapters@sha256:" + "0" * 64
    args = c["args"]
    assert flags(args, "metrics-url") == ["http://a:9108/metrics", "http://b:9108/metrics"]
    assert flags(args, "vllm-url") == ["http://vllm-0:8000"]
    assert flags(args, "max-drift") == ["0.25"] and flags(args, "margin") == ["0.02"]
    assert flags(args, "base") == ["/models/base"]
    assert args[-1] == "--agent=booking"


def test_network_policies_admit_the_job(helm: str) -> None:
    docs = enabled(**{"networkPolicy.enabled": "true"})
    pod_labels = one(docs, "CronJob", CRONJOB)["spec"]["jobTemplate"]["spec"]["template"]["metadata"]["labels"]
    sidecar = one(docs, "NetworkPolicy", RELEASE)["spec"]
    (scrape,) = sidecar["ingress"]
    assert any(p.get("podSelector", {}).get("matchLabels") == pod_labels for p in scrape["from"])
    vllm = one(docs, "NetworkPolicy", f"{RELEASE}-vllm")["spec"]
    assert any(p.get("podSelector", {}).get("matchLabels") == pod_labels for p in vllm["ingress"][0]["from"])
    # Without the loop, neither admits it.
    plain = rendered({"networkPolicy.enabled": "true", "vllm.enabled": "true"})
    text = json.dumps([d for d in plain if d["kind"] == "NetworkPolicy"])
    assert "adapter-loop" not in text


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"vllm.adapters.runtimeLoading": "false"}, "needs vllm.adapters.runtimeLoading"),
        ({"config.scoring.enabled": "false"}, "needs config.scoring.enabled"),
        ({"config.scoring.routing.enabled": "false"}, "needs config.scoring.routing.enabled"),
        ({"vllm.replicaCount": "2"}, "list every server in adapterLoop.vllmUrls"),
        ({"vllm.enabled": "false"}, "needs a vLLM to load promoted adapters into"),
        ({"vllm.adapters.volume": "null"}, "needs vllm.adapters.volume"),
        ({"webConfig.scrape.enabled": "true", "helmTest.enabled": "false"}, "plain HTTP without credentials"),
    ],
)
def test_guards(helm: str, values: dict[str, str], message: str) -> None:
    proc = run_helm(*template_args(set_values={**ENABLED, **values}), check=False)
    assert proc.returncode != 0, "helm rendered the adapter loop"
    assert message in proc.stderr, proc.stderr


def test_guards_pass_with_what_they_ask_for(helm: str) -> None:
    # Several vLLM replicas, each named; an external vLLM named in vllmUrls.
    assert by_kind(enabled(**{"vllm.replicaCount": "2", "adapterLoop.vllmUrls[0]": "http://v0:8000"}), "CronJob")
    external = enabled(**{"vllm.enabled": "false", "adapterLoop.vllmUrls[0]": "http://vllm.models:8000"})
    assert flags(job_container(external)["args"], "vllm-url") == ["http://vllm.models:8000"]


def test_the_schema_refuses_bad_loop_values(helm: str) -> None:
    for values, message in (
        ({"adapterLoop.maxDrift": "0"}, "maxDrift"),
        ({"adapterLoop.margin": "1"}, "margin"),
        ({"adapterLoop.schedule": "daily"}, "schedule"),
        ({"adapterLoop.metricsUrls[0]": "sidecar:9108"}, "metricsUrls"),
        ({"adapterLoop.concurrencyPolicy": "Allow"}, "concurrencyPolicy"),
    ):
        proc = run_helm(*template_args(set_values={**ENABLED, **values}), check=False)
        assert proc.returncode != 0, values
        assert "values don't meet the specifications of the schema" in proc.stderr, proc.stderr
        assert message in proc.stderr, proc.stderr


def test_the_dashboard_shows_the_routes_next_to_the_drift() -> None:
    dashboard = json.loads((CHART / "dashboards" / "fleet-overview.json").read_text())
    by_title = {p["title"]: p for p in dashboard["panels"]}
    routes, drift = by_title["Adapter routes"], by_title["Adapter drift per agent"]
    assert routes["gridPos"]["y"] == drift["gridPos"]["y"]
    exprs = {t["refId"]: t["expr"] for t in routes["targets"]}
    assert "sidecar_adapter_route_version" in exprs["A"] and "by (agent)" in exprs["A"]
    assert "increase(sidecar_adapter_route_changes_total" in exprs["B"]
    assert "by (agent, decision)" in exprs["B"]
    for expr in exprs.values():
        assert 'agent=~"$agent"' in expr
