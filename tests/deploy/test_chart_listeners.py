"""The chart's two listeners (docs/security.md): ``http-metrics`` and, with
``config.http.operator.port``, ``http-operator``; their web-config files and certificates mounted
from Secrets; the probes, the ServiceMonitor and the NetworkPolicy that follow them; and the
renders that fail with the fix instead of deploying something the sidecar or Prometheus refuses.

The scenario is helm/sidecar/ci/secure-values.yaml (linted, validated and checked against the
restricted pod-security profile with the other scenarios).
"""

from __future__ import annotations

import base64
import shutil
from collections.abc import Callable, Mapping, Sequence
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from sidecar.config import load_config
from sidecar.telemetry.web_config import load_web_config
from tests.deploy.chart import CHART, NAMESPACE, RELEASE, by_kind, one, render, run_helm, scenarios, template_args
from tests.deploy.kube import validation_errors
from tests.support.tls import make_pki

SECURE = CHART / "ci" / "secure-values.yaml"
MONITORING = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
OPERATORS = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "agents-operators"}}}


@cache
def secure() -> tuple[dict[str, Any], ...]:
    return tuple(render([SECURE]))


def sidecar_container(docs: Sequence[Mapping[str, Any]]) -> Mapping[str, Any]:
    spec = one(docs, "Deployment", RELEASE)["spec"]["template"]["spec"]
    found: Mapping[str, Any] = next(c for c in spec["containers"] if c["name"] == "sidecar")
    return found


def volume(docs: Sequence[Mapping[str, Any]], name: str) -> Mapping[str, Any] | None:
    spec = one(docs, "Deployment", RELEASE)["spec"]["template"]["spec"]
    return next((v for v in spec["volumes"] if v["name"] == name), None)


def config_file(docs: Sequence[Mapping[str, Any]], tmp_path: Path) -> Path:
    (config_map,) = [d for d in by_kind(docs, "ConfigMap") if "sidecar.yaml" in d.get("data", {})]
    path = tmp_path / "sidecar.yaml"
    path.write_text(config_map["data"]["sidecar.yaml"])
    return path


def variant(tmp_path: Path, name: str, edit: Callable[[dict[str, Any]], None]) -> Path:
    """secure-values.yaml changed by ``edit``, as a values file of its own (helm merges maps, so
    an overlay could not take a key away)."""
    values = yaml.safe_load(SECURE.read_text())
    edit(values)
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(values))
    return path


def ingress(docs: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    rules: list[dict[str, Any]] = one(docs, "NetworkPolicy", RELEASE)["spec"]["ingress"]
    return rules


def test_both_ports_on_the_container_and_the_service(helm: str) -> None:
    docs = secure()
    assert sidecar_container(docs)["ports"] == [
        {"name": "http-metrics", "containerPort": 9108, "protocol": "TCP"},
        {"name": "http-operator", "containerPort": 9109, "protocol": "TCP"},
    ]
    assert one(docs, "Service", RELEASE)["spec"]["ports"] == [
        {"name": "http-metrics", "port": 9108, "targetPort": 9108, "protocol": "TCP"},
        {"name": "http-operator", "port": 9109, "targetPort": 9109, "protocol": "TCP"},
    ]


def test_probes_stay_on_the_scrape_port_over_https(helm: str) -> None:
    c = sidecar_container(secure())
    for probe, path in (("startupProbe", "/healthz"), ("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
        assert c[probe]["httpGet"] == {"path": path, "port": "http-metrics", "scheme": "HTTPS"}


def test_web_config_and_certificates_are_mounted_from_secrets(helm: str) -> None:
    docs = secure()
    assert {"name": "web-config", "mountPath": "/etc/sidecar/web", "readOnly": True} in sidecar_container(docs)[
        "volumeMounts"
    ]
    projected = volume(docs, "web-config")
    assert projected is not None
    assert projected["projected"]["sources"] == [
        {"secret": {"name": f"{RELEASE}-web-config"}},
        {"secret": {"name": "sidecar-tls"}},
    ]
    assert projected["projected"]["defaultMode"] == 0o440  # readable through fsGroup, by nobody else
    secret = one(docs, "Secret", f"{RELEASE}-web-config")
    assert sorted(secret["data"]) == ["operator.yml", "scrape.yml"]
    annotations = one(docs, "Deployment", RELEASE)["spec"]["template"]["metadata"]["annotations"]
    assert "checksum/web-config" in annotations


def test_the_sidecar_starts_with_the_rendered_files(helm: str, tmp_path: Path) -> None:
    """The ConfigMap's paths, the Secret's files and a certificate Secret's keys, laid out as the
    projected volume lays them out, are what the sidecar's own loaders accept."""
    docs = secure()
    cfg = load_config(config_file(docs, tmp_path))
    bindings = {b.name: b for b in cfg.http.bindings()}
    ports = {p["name"]: p["containerPort"] for p in sidecar_container(docs)["ports"]}
    assert (bindings["scrape"].port, bindings["operator"].port) == (ports["http-metrics"], ports["http-operator"])
    assert bindings["scrape"].operator_routes is False  # the pages are not on the scrape port

    mount = tmp_path / "mount"
    mount.mkdir()
    for key, value in one(docs, "Secret", f"{RELEASE}-web-config")["data"].items():
        (mount / key).write_bytes(base64.b64decode(value))
    (tmp_path / "pki").mkdir()
    pki = make_pki(tmp_path / "pki")
    for source, key in ((pki.server_cert, "tls.crt"), (pki.server_key, "tls.key"), (pki.ca, "ca.crt")):
        shutil.copy(source, mount / key)  # the keys of a cert-manager Certificate's Secret
    mount_path = Path(
        next(m["mountPath"] for m in sidecar_container(docs)["volumeMounts"] if m["name"] == "web-config")
    )
    for name in ("scrape", "operator"):
        configured = bindings[name].web_config_file
        assert configured is not None and configured.parent == mount_path
        web = load_web_config(mount / configured.name)
        assert web.tls is not None and web.tls.cert_file == mount / "tls.crt"
        assert web.users
    operator = load_web_config(mount / "operator.yml")
    assert operator.tls is not None and operator.tls.client_ca_file == mount / "ca.crt"


def test_service_monitor_scrapes_with_tls_and_basic_auth(helm: str) -> None:
    docs = secure()
    monitor = one(docs, "ServiceMonitor", RELEASE)
    assert validation_errors(monitor) == []
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] == "http-metrics"
    assert endpoint["scheme"] == "https"
    assert endpoint["tlsConfig"] == {
        "ca": {"secret": {"name": "sidecar-tls", "key": "ca.crt"}},
        # Prometheus scrapes pod addresses: the name to check on the certificate is the Service's.
        "serverName": f"{RELEASE}.{NAMESPACE}.svc",
    }
    assert one(docs, "Service", RELEASE)["metadata"]["name"] == RELEASE
    assert endpoint["basicAuth"] == {
        "username": {"name": "sidecar-scrape-credentials", "key": "username"},
        "password": {"name": "sidecar-scrape-credentials", "key": "password"},
    }
    assert "authorization" not in endpoint
    broken = {**endpoint, "basicAuth": {"username": "prometheus"}}  # a plain string, not a Secret reference
    assert validation_errors({**monitor, "spec": {**monitor["spec"], "endpoints": [broken]}})


def test_service_monitor_bearer_token_and_own_server_name(helm: str) -> None:
    docs = render(
        [SECURE],
        {
            "serviceMonitor.basicAuth": "null",
            "serviceMonitor.authorization.credentials.name": "scrape-token",
            "serviceMonitor.authorization.credentials.key": "token",
            "serviceMonitor.tlsConfig.serverName": "sidecar.example.internal",
        },
        ["templates/servicemonitor.yaml"],
    )
    monitor = one(docs, "ServiceMonitor", RELEASE)
    assert validation_errors(monitor) == []
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["authorization"] == {"type": "Bearer", "credentials": {"name": "scrape-token", "key": "token"}}
    assert "basicAuth" not in endpoint
    assert endpoint["tlsConfig"]["serverName"] == "sidecar.example.internal"


def test_vllm_monitor_and_plain_scrapes_are_untouched(helm: str, tmp_path: Path) -> None:
    def plain(values: dict[str, Any]) -> None:  # basic auth without TLS on the scrape listener
        values["vllm"] = {"enabled": True}
        del values["serviceMonitor"]["tlsConfig"], values["webConfig"]["scrape"]["config"]["tls_server_config"]

    docs = render([variant(tmp_path, "plain", plain)])
    vllm = one(docs, "ServiceMonitor", f"{RELEASE}-vllm")["spec"]["endpoints"][0]
    assert not {"scheme", "tlsConfig", "basicAuth", "authorization"} & vllm.keys()
    sidecar = one(docs, "ServiceMonitor", RELEASE)["spec"]["endpoints"][0]
    assert "scheme" not in sidecar and "tlsConfig" not in sidecar and "basicAuth" in sidecar
    assert "scheme" not in sidecar_container(docs)["readinessProbe"]["httpGet"]


def test_network_policy_admits_each_port_from_its_own_peers(helm: str) -> None:
    assert ingress(secure()) == [
        {"ports": [{"port": 9108, "protocol": "TCP"}], "from": [MONITORING]},
        {"ports": [{"port": 9109, "protocol": "TCP"}], "from": [OPERATORS]},
    ]


def test_an_empty_peer_list_opens_no_port(helm: str, tmp_path: Path) -> None:
    """A NetworkPolicy rule without ``from`` admits every source: a port without peers gets no rule."""

    def no_operators(values: dict[str, Any]) -> None:
        values["networkPolicy"]["operatorFrom"] = []

    def nobody(values: dict[str, Any]) -> None:
        values["networkPolicy"].update(operatorFrom=[], metricsFrom=[])

    rules = ingress(render([variant(tmp_path, "no-operators", no_operators)]))
    assert rules == [{"ports": [{"port": 9108, "protocol": "TCP"}], "from": [MONITORING]}]
    docs = render([variant(tmp_path, "nobody", nobody)])
    policy = one(docs, "NetworkPolicy", RELEASE)
    assert policy["spec"]["ingress"] == [] and "Ingress" in policy["spec"]["policyTypes"]
    assert validation_errors(policy) == []


@pytest.mark.parametrize("path", scenarios(), ids=lambda p: p.stem.removesuffix("-values"))
def test_no_scenario_renders_an_open_ingress_rule(helm: str, path: Path) -> None:
    for policy in by_kind(render([path]), "NetworkPolicy"):
        for rule in policy["spec"].get("ingress", []):
            assert rule.get("from"), f"{policy['metadata']['name']} admits every source: {rule}"


def test_existing_web_config_secret(helm: str) -> None:
    docs = render(
        set_values={
            "helmTest.enabled": "false",
            "webConfig.existingSecret": "my-web-config",
            "webConfig.scrape.enabled": "true",
            "webConfig.scrape.tls": "true",
        }
    )
    assert [s for s in by_kind(docs, "Secret") if s["metadata"]["name"].endswith("-web-config")] == []
    projected = volume(docs, "web-config")
    assert projected is not None
    assert projected["projected"]["sources"] == [{"secret": {"name": "my-web-config"}}]
    assert sidecar_container(docs)["livenessProbe"]["httpGet"]["scheme"] == "HTTPS"
    assert [p["name"] for p in sidecar_container(docs)["ports"]] == ["http-metrics"]


def test_defaults_mount_nothing_and_open_one_port(helm: str) -> None:
    docs = render()
    assert volume(docs, "web-config") is None
    assert [p["name"] for p in one(docs, "Service", RELEASE)["spec"]["ports"]] == ["http-metrics"]
    assert "scheme" not in sidecar_container(docs)["startupProbe"]["httpGet"]


def test_scrape_port_follows_its_own_setting(helm: str) -> None:
    docs = render(set_values={"config.http.scrape.port": "9300", "config.http.operator.port": "9301"})
    ports = {p["name"]: p["containerPort"] for p in sidecar_container(docs)["ports"]}
    assert ports == {"http-metrics": 9300, "http-operator": 9301}


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"config.http.operator.port": "null"}, "webConfig.operator.enabled needs config.http.operator.port"),
        ({"config.http.operator.port": "9108"}, "config.http.operator.port must differ"),
        ({"helmTest.enabled": "true"}, "set helmTest.enabled: false"),
        (
            {"webConfig.scrape.enabled": "false", "webConfig.scrape.tls": "true", "serviceMonitor.enabled": "false"},
            "webConfig.scrape.tls needs webConfig.scrape.enabled",
        ),
        ({"config.http.scrape.web_config_file": "/elsewhere.yml"}, "leave that one unset"),
        ({"config.http.scrape.enabled": "false"}, "the chart needs the scrape listener"),
        ({"serviceMonitor.authorization.credentials.key": "t"}, "set one of them"),
        ({"serviceMonitor.scheme": "http"}, "serviceMonitor.tlsConfig without TLS"),
    ],
)
def test_guards(helm: str, values: dict[str, str], message: str) -> None:
    proc = run_helm(*template_args([SECURE], set_values=values), check=False)
    assert proc.returncode != 0
    assert message in proc.stderr, proc.stderr


@pytest.mark.parametrize(
    ("values", "message"),
    [
        # a password pasted where its bcrypt hash belongs
        ({"webConfig.scrape.config.basic_auth_users.prometheus": "hunter2"}, "basic_auth_users"),
        ({"webConfig.scrape.config.tls_server_config.client_auth_type": "RequireAnyClientCert"}, "client_auth_type"),
        ({"webConfig.scrape.config.tls_server_config.cipher_suites[0]": "x"}, "cipher_suites"),
        ({"webConfig.scrape.config.web_listen_address": "0.0.0.0"}, "web_listen_address"),
        ({"serviceMonitor.tlsConfig.ca.secret.key": "null", "serviceMonitor.tlsConfig.ca.secret.nme": "x"}, "nme"),
        ({"serviceMonitor.scheme": "ftp"}, "scheme"),
        ({"webConfig.mountPath": "relative"}, "mountPath"),
    ],
)
def test_bad_values_are_refused_by_the_schema(helm: str, values: dict[str, str], message: str) -> None:
    proc = run_helm(*template_args([SECURE], set_values=values), check=False)
    assert proc.returncode != 0
    assert "schema" in proc.stderr and message in proc.stderr, proc.stderr
