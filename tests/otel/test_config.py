"""The ``otel`` section: off by default, validated, secrets masked, wired by build_doors."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from sidecar.config import dump_yaml, load_config
from sidecar.errors import ConfigError
from sidecar.otel import build_doors
from sidecar.otel.bridge import OtlpKafkaBridge
from sidecar.otel.producer import OtelEventProducer
from sidecar.otel.receiver import OtlpHttpReceiver


def test_off_by_default() -> None:
    cfg = load_config()
    assert not cfg.otel.enabled
    assert build_doors(cfg.otel, cfg.kafka, CollectorRegistry()).components == []


def test_both_doors_share_one_producer_started_first() -> None:
    cfg = load_config(overrides={"otel": {"receiver": {"enabled": True}, "bridge": {"enabled": True}}})
    doors = build_doors(cfg.otel, cfg.kafka, CollectorRegistry())
    assert [type(c) for c in doors.components] == [OtelEventProducer, OtlpHttpReceiver, OtlpKafkaBridge]
    assert [h.health().name for h in doors.health] == ["otel-receiver", "otel-bridge"]


def test_the_bearer_token_comes_from_the_environment_and_is_masked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SIDECAR_OTEL__RECEIVER__BEARER_TOKEN", "t0ken")
    cfg = load_config(overrides={"otel": {"receiver": {"enabled": True}}})
    assert cfg.otel.receiver.bearer_token is not None
    assert cfg.otel.receiver.bearer_token.get_secret_value() == "t0ken"
    assert "t0ken" not in dump_yaml(cfg)


@pytest.mark.parametrize(
    "otel",
    [
        {"bridge": {"enabled": True, "topic": "agent.conversations"}},  # the events topic itself
        {"bridge": {"topic": "a", "dead_letter_topic": "a"}},
        {"bridge": {"encoding": "otlp_xml"}},
        {"receiver": {"max_body_bytes": 10}},
        {"recever": {}},
    ],
)
def test_invalid(otel: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        load_config(overrides={"otel": otel})
