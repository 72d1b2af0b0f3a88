"""The chart's OpenTelemetry bits: with ``config.otel.receiver.enabled`` the container opens
``otlp-http``, a Service of ready pods exposes it, the NetworkPolicy admits only the configured
peers, and a render without a token (or with an open NetworkPolicy rule) fails with the fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from sidecar.config import load_config
from tests.deploy.chart import CHART, RELEASE, by_kind, one, render, run_helm, template_args

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
