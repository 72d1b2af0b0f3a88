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
    cfg = load_config(
        overrides={"otel": {"receiver": {"enabled": True, "bearer_token": "t"}, "bridge": {"enabled": True}}}
    )
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


def test_an_enabled_receiver_refuses_to_start_open() -> None:
    with pytest.raises(ConfigError) as err:
        load_config(overrides={"otel": {"receiver": {"enabled": True}}})
    # the operator is told both ways out: the token's variable and the explicit opt-out
    assert "SIDECAR_OTEL__RECEIVER__BEARER_TOKEN" in str(err.value)
    assert "allow_unauthenticated" in str(err.value)
    cfg = load_config(overrides={"otel": {"receiver": {"enabled": True, "allow_unauthenticated": True}}})
    assert cfg.otel.receiver.bearer_token is None
    assert not load_config(overrides={"otel": {"receiver": {"enabled": False}}}).otel.receiver.enabled


@pytest.mark.parametrize("token", ["", " t0ken", "t0ken\n", "t0\x07ken"])
def test_an_unusable_token_is_refused_without_being_echoed(token: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SIDECAR_OTEL__RECEIVER__BEARER_TOKEN", token)  # an empty or mangled secret
    with pytest.raises(ConfigError) as err:
        load_config(overrides={"otel": {"receiver": {"enabled": True, "allow_unauthenticated": True}}})
    assert "bearer_token" in str(err.value)
    if token.strip():
        assert "t0" not in str(err.value)


def test_the_bridge_dead_letter_topic_follows_its_topic() -> None:
    from sidecar.otel.config import OtlpKafkaBridgeConfig

    assert OtlpKafkaBridgeConfig().dead_letter_topic == "otlp_spans.dlq"
    assert OtlpKafkaBridgeConfig(topic="team-a.spans").dead_letter_topic == "team-a.spans.dlq"
    assert OtlpKafkaBridgeConfig(topic="t", dead_letter_topic="elsewhere").dead_letter_topic == "elsewhere"
