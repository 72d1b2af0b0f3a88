"""The chart's OpenTelemetry bits: with ``config.otel.receiver.enabled`` the container opens
``otlp-http``, a Service of ready pods exposes it, the NetworkPolicy admits only the configured
peers, and a render without a token (or with an open NetworkPolicy rule) fails with the fix.
``webConfig.otlp`` gives the receiver its web-config file (TLS) like the other listeners'."""

from __future__ import annotations

import base64
import shutil
import ssl
from pathlib import Path
from typing import Any

import pytest
import yaml

from sidecar.config import load_config
from sidecar.telemetry.web_config import load_web_config
from tests.deploy.chart import CHART, RELEASE, by_kind, one, render, run_helm, template_args
from tests.support.tls import make_pki

OTEL = CHART / "ci" / "otel-values.yaml"
COLLECTOR = {
    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "observability"}},
    "podSelector": {"matchLabels": {"app.kubernetes.io/name": "opentelemetry-collector"}},
}


def test_the_receiver_port_service_and_network_policy(helm: str, tmp_path: Path) -> None:
    docs = render([OTEL])
    deployment = one(docs, "Deployment", RELEASE)
    (sidecar,) = [c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "sidecar"]
    assert {"name": "otlp-http", "containerPort": 4318, "protocol": "TCP"} in sidecar["ports"]

    service = one(docs, "Service", f"{RELEASE}-otlp")["spec"]
    assert service["ports"] == [
        {"name": "otlp-http", "port": 4318, "targetPort": "otlp-http", "protocol": "TCP", "appProtocol": "http"}
    ]
    assert service["selector"] == deployment["spec"]["selector"]["matchLabels"]
    assert not service.get("publishNotReadyAddresses")  # spans go to ready pods only
    metrics = one(docs, "Service", RELEASE)["spec"]
    assert [p["name"] for p in metrics["ports"]] == ["http-metrics"]  # the scrape Service is untouched

    policy = one(docs, "NetworkPolicy", RELEASE)["spec"]
    (otlp,) = [rule for rule in policy["ingress"] if rule["ports"] == [{"port": 4318, "protocol": "TCP"}]]
    assert otlp["from"] == [COLLECTOR]

    # the pod's configuration with the chart's Secret: the receiver starts, with the token
    (config_map,) = [d for d in by_kind(docs, "ConfigMap") if "sidecar.yaml" in d["data"]]
    path = tmp_path / "sidecar.yaml"
    path.write_text(config_map["data"]["sidecar.yaml"])
    cfg = load_config(path, overrides={"otel": {"receiver": {"bearer_token": "from-the-secret"}}})
    assert cfg.otel.receiver.enabled and cfg.otel.bridge.enabled
    (secret,) = by_kind(docs, "Secret")
    assert "SIDECAR_OTEL__RECEIVER__BEARER_TOKEN" in secret["data"]


def test_the_port_follows_the_config(helm: str) -> None:
    docs = render([OTEL], set_values={"config.otel.receiver.port": "14318"})
    assert one(docs, "Service", f"{RELEASE}-otlp")["spec"]["ports"][0]["port"] == 14318
    policy = one(docs, "NetworkPolicy", RELEASE)["spec"]
    assert any(rule["ports"] == [{"port": 14318, "protocol": "TCP"}] for rule in policy["ingress"])


def test_nothing_otlp_without_the_receiver(helm: str) -> None:
    docs = render(set_values={"networkPolicy.enabled": "true", "config.otel.bridge.enabled": "true"})
    assert not [d for d in by_kind(docs, "Service") if d["metadata"]["name"].endswith("-otlp")]
    deployment = one(docs, "Deployment", RELEASE)
    ports = [p["name"] for c in deployment["spec"]["template"]["spec"]["containers"] for p in c.get("ports", [])]
    assert "otlp-http" not in ports
    assert len(one(docs, "NetworkPolicy", RELEASE)["spec"]["ingress"]) == 1


def test_in_pod_mode_has_no_receiver_service(helm: str) -> None:
    docs = render(
        set_values={
            "mode": "inPod",
            "inPod.podSelector.app": "agent",
            "config.otel.receiver.enabled": "true",
            "secrets.otelReceiverBearerToken": "t",
        }
    )
    assert not [d for d in by_kind(docs, "Service") if d["metadata"]["name"].endswith("-otlp")]


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"secrets.otelReceiverBearerToken": ""}, "secrets.otelReceiverBearerToken"),
        ({"networkPolicy.otlpFrom": "{}"}, "networkPolicy.otlpFrom"),  # an empty list
        ({"config.otel.receiver.port": "9108"}, "must differ from config.http.port"),
    ],
)
def test_guards(helm: str, values: dict[str, str], message: str) -> None:
    proc = run_helm(*template_args([OTEL], set_values=values), check=False)
    assert proc.returncode != 0
    assert message in proc.stderr


def test_an_open_receiver_is_rendered_only_when_said_so(helm: str) -> None:
    values = {"secrets.otelReceiverBearerToken": "", "config.otel.receiver.allow_unauthenticated": "true"}
    docs = render([OTEL], set_values=values)
    assert one(docs, "Service", f"{RELEASE}-otlp")


# --- TLS on the receiver: webConfig.otlp ---------------------------------------------------------

OTLP_TLS = {
    "webConfig": {
        "otlp": {
            "enabled": True,
            "config": {
                "tls_server_config": {"cert_file": "tls.crt", "key_file": "tls.key", "client_ca_file": "ca.crt"},
                "http_server_config": {"headers": {"Strict-Transport-Security": "max-age=31536000"}},
            },
        },
        "tls": {"secretName": "sidecar-tls"},
    }
}


BCRYPT = "$2b$12$eG8S.Y.oXvkRVdKuF1Uk7.y.xqtXumODTk.IrT9hG9t2kcOAZteVq"


def _values(tmp_path: Path, values: dict[str, Any]) -> Path:
    path = tmp_path / "otlp-tls.yaml"
    path.write_text(yaml.safe_dump(values))
    return path


def test_the_receiver_gets_its_web_config_file_and_certificates(helm: str, tmp_path: Path) -> None:
    overlay = _values(tmp_path, OTLP_TLS)
    lint = run_helm("lint", "--strict", str(CHART), "--values", str(OTEL), "--values", str(overlay), check=False)
    assert lint.returncode == 0, lint.stdout + lint.stderr
    docs = render([OTEL, overlay])
    secret = one(docs, "Secret", f"{RELEASE}-web-config")
    assert sorted(secret["data"]) == ["otlp.yml"]
    spec = one(docs, "Deployment", RELEASE)["spec"]["template"]
    assert "checksum/web-config" in spec["metadata"]["annotations"]
    (projected,) = [v for v in spec["spec"]["volumes"] if v["name"] == "web-config"]
    assert projected["projected"]["sources"] == [
        {"secret": {"name": f"{RELEASE}-web-config"}},
        {"secret": {"name": "sidecar-tls"}},
    ]
    (sidecar,) = [c for c in spec["spec"]["containers"] if c["name"] == "sidecar"]
    assert {"name": "web-config", "mountPath": "/etc/sidecar/web", "readOnly": True} in sidecar["volumeMounts"]

    # The ConfigMap points the receiver at the file; the HTTP listeners keep their own settings.
    (config_map,) = [d for d in by_kind(docs, "ConfigMap") if "sidecar.yaml" in d["data"]]
    path = tmp_path / "sidecar.yaml"
    path.write_text(config_map["data"]["sidecar.yaml"])
    cfg = load_config(path, overrides={"otel": {"receiver": {"bearer_token": "from-the-secret"}}})
    assert cfg.otel.receiver.web_config_file == Path("/etc/sidecar/web/otlp.yml")
    assert cfg.otel.bridge.topic == "otlp_spans"  # the rest of config.otel is kept
    assert all(b.web_config_file is None for b in cfg.http.bindings())

    # The file and a certificate Secret's keys, laid out as the projected volume lays them out,
    # are what the receiver's loader accepts: TLS with client certificates checked, the header.
    mount = tmp_path / "mount"
    mount.mkdir()
    (mount / "otlp.yml").write_bytes(base64.b64decode(secret["data"]["otlp.yml"]))
    (tmp_path / "pki").mkdir()
    pki = make_pki(tmp_path / "pki")
    for source, key in ((pki.server_cert, "tls.crt"), (pki.server_key, "tls.key"), (pki.ca, "ca.crt")):
        shutil.copy(source, mount / key)
    web = load_web_config(mount / "otlp.yml")
    assert web.tls is not None and web.tls.client_ca_file == mount / "ca.crt"
    assert web.tls.ssl_context().verify_mode == ssl.CERT_REQUIRED
    assert web.headers == {"Strict-Transport-Security": "max-age=31536000"} and not web.users


def test_an_existing_secret_carries_otlp_yml(helm: str) -> None:
    values = {"webConfig.existingSecret": "my-web-config", "webConfig.otlp.enabled": "true"}
    docs = render([OTEL], set_values=values)
    assert [s for s in by_kind(docs, "Secret") if s["metadata"]["name"].endswith("-web-config")] == []
    spec = one(docs, "Deployment", RELEASE)["spec"]["template"]["spec"]
    (projected,) = [v for v in spec["volumes"] if v["name"] == "web-config"]
    assert projected["projected"]["sources"] == [{"secret": {"name": "my-web-config"}}]


def test_without_web_config_otlp_nothing_is_mounted(helm: str, tmp_path: Path) -> None:
    docs = render([OTEL])
    spec = one(docs, "Deployment", RELEASE)["spec"]["template"]["spec"]
    assert not [v for v in spec["volumes"] if v["name"] == "web-config"]
    (config_map,) = [d for d in by_kind(docs, "ConfigMap") if "sidecar.yaml" in d["data"]]
    assert "web_config_file" not in config_map["data"]["sidecar.yaml"]


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"config.otel.receiver.enabled": "false"}, "webConfig.otlp.enabled needs config.otel.receiver.enabled"),
        ({"config.otel.receiver.web_config_file": "/x.yml"}, "leave that one unset"),
        (
            {"webConfig.otlp.config.basic_auth_users.collector": BCRYPT},
            "the OTLP receiver authenticates by bearer token",
        ),
        ({"webConfig.otlp.extra": "1"}, "Additional property extra is not allowed"),  # the schema closes it
    ],
)
def test_web_config_otlp_guards(helm: str, values: dict[str, str], message: str) -> None:
    proc = run_helm(*template_args([OTEL], set_values={"webConfig.otlp.enabled": "true", **values}), check=False)
    assert proc.returncode != 0
    assert message in proc.stderr
