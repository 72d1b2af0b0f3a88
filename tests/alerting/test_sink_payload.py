"""The wire form every sink shares, the MQTT topic encoding and the sink factory (no network)."""

from __future__ import annotations

import json
import re
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import SecretStr

from sidecar.alerting.alert import ALERT_KINDS
from sidecar.alerting.config import AlertingConfig, AlertSinksConfig, MqttSinkConfig, WebhookSinkConfig
from sidecar.alerting.sinks import AlertSink, build_sinks
from sidecar.alerting.sinks._common import MAX_PAYLOAD_BYTES, SCHEMA_MAX_CHARS, encode_payload, wire_payload
from sidecar.alerting.sinks.alertmanager import AlertmanagerAlertSink
from sidecar.alerting.sinks.base import AlertRejected
from sidecar.alerting.sinks.kafka import KafkaAlertSink
from sidecar.alerting.sinks.mqtt import MqttAlertSink, render_topic, topic_value
from sidecar.alerting.sinks.webhook import WebhookAlertSink
from sidecar.errors import ConfigError
from sidecar.source.config import KafkaConfig
from tests.alerting.alerts import hostile_alert, make_alert


def test_the_caps_are_the_schemas(alert_schema: dict[str, Any]) -> None:
    props = alert_schema["properties"]
    assert {k: props[k]["maxLength"] for k in SCHEMA_MAX_CHARS} == SCHEMA_MAX_CHARS


def test_an_ordinary_alert_is_sent_as_its_payload(validate_payload: Callable[[Any], None]) -> None:
    alert = make_alert(3, details={"leaves": 4, "p_end": float("nan")}, text={"best_branch": "ok"})
    assert wire_payload(alert) == alert.payload()
    decoded = json.loads(encode_payload(alert))
    assert decoded["details"]["p_end"] is None
    validate_payload(decoded)


def test_a_hostile_alert_is_bounded_valid_json(validate_payload: Callable[[Any], None]) -> None:
    raw = encode_payload(hostile_alert())
    assert len(raw) < MAX_PAYLOAD_BYTES
    decoded = json.loads(raw.decode("utf-8"))  # strict UTF-8: no lone surrogate made it through
    validate_payload(decoded)
    assert decoded["details"]["nan"] is None
    assert decoded["details"]["inf"] is None
    assert decoded["details"]["control"].startswith("\x00\x01")  # kept, JSON-escaped, not dropped
    assert decoded["details"]["huge"].endswith("\u2026")
    assert set(decoded["text"]) == {"best_branch", "remaining_tasks"}


def test_the_worst_case_stays_under_the_stated_bound() -> None:
    # Every string at its cap and made of control characters (6 bytes each once escaped).
    worst = "\x01" * 100_000
    alert = make_alert(
        summary=worst,
        agent=worst,
        tenant=worst,
        goal=worst,
        conversation_id=worst,
        tree_url=worst,
        details={worst + str(i): worst for i in range(100)},
        text={"best_branch": worst, "remaining_tasks": worst},
    )
    assert len(encode_payload(alert)) < MAX_PAYLOAD_BYTES


@pytest.mark.parametrize(
    "overrides",
    [
        {"id": "../../etc"},
        {"id": "A" * 32},
        {"id": "0" * 31 + "\n"},
        {"id": "0" * 32 + "\r\nx-injected: 1"},
        {"kind": "page_everyone"},
        {"severity": "apocalyptic"},
        {"turn": -1},
        {"turn": True},
        {"conversation_id": ""},
    ],
)
def test_a_malformed_alert_is_rejected_by_every_sink(overrides: dict[str, Any]) -> None:
    with pytest.raises(AlertRejected, match="malformed alert"):
        encode_payload(make_alert(**overrides))


@given(st.text(max_size=200))
def test_a_topic_value_is_one_level_without_wildcards(value: str) -> None:
    encoded = topic_value(value)
    assert encoded
    assert not set(encoded) & set("/+#$\x00")
    assert not any(ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F or 0xD800 <= ord(c) <= 0xDFFF for c in encoded)
    if value and not any(0xD800 <= ord(c) <= 0xDFFF for c in value):
        assert urllib.parse.unquote(encoded) == value[:128]  # reversible: distinct values stay distinct


def test_a_hostile_alert_keeps_the_templates_levels() -> None:
    topic = render_topic("alerts/{tenant}/{agent}/{severity}/{kind}", hostile_alert())
    levels = topic.split("/")
    assert len(levels) == 5
    assert levels[0] == "alerts"
    assert levels[3:] == ["warning", "uncertain_turn"]
    assert render_topic("a/{tenant}", make_alert(tenant=None)) == "a/_"


def test_alertnames_are_camel_case_per_kind() -> None:
    from sidecar.alerting.sinks.alertmanager import ALERTNAMES

    assert ALERTNAMES == {
        "uncertain_turn": "AgentUncertainTurn",
        "conversation_incomplete": "AgentConversationIncomplete",
        "conversation_stalled": "AgentConversationStalled",
    }
    assert set(ALERTNAMES) == set(ALERT_KINDS)


def test_label_names_are_valid_for_alertmanager() -> None:
    from sidecar.alerting.config import AlertmanagerSinkConfig
    from sidecar.alerting.sinks.alertmanager import to_alertmanager

    for alert in (make_alert(), hostile_alert(), make_alert(tenant=None, goal=None)):
        posted = to_alertmanager(alert, AlertmanagerSinkConfig(), 1_000.0)
        assert all(re.fullmatch(r"[a-zA-Z_][a-zA-Z0-9_]*", name) for name in posted["labels"])
        assert all(re.fullmatch(r"[a-zA-Z_][a-zA-Z0-9_]*", name) for name in posted["annotations"])
    bare = to_alertmanager(make_alert(tenant=None, goal=None), AlertmanagerSinkConfig(), 1_000.0)
    assert "tenant" not in bare["labels"]
    assert "goal" not in bare["labels"]


def _all_enabled(tmp_path: Path) -> AlertingConfig:
    del tmp_path
    return AlertingConfig(
        enabled=True,
        sinks=AlertSinksConfig.model_validate(
            {
                "mqtt": {"enabled": True},
                "alertmanager": {"enabled": True},
                "webhook": {"enabled": True, "url": "http://127.0.0.1:9/hook", "secret": "whsec_c2VjcmV0"},
                "kafka": {"enabled": True},
            }
        ),
    )


async def test_build_sinks_makes_the_enabled_ones(tmp_path: Path) -> None:
    assert build_sinks(AlertingConfig(), KafkaConfig()) == []
    sinks = build_sinks(_all_enabled(tmp_path), KafkaConfig())
    assert [type(s) for s in sinks] == [MqttAlertSink, AlertmanagerAlertSink, WebhookAlertSink, KafkaAlertSink]
    assert [s.name for s in sinks] == ["mqtt", "alertmanager", "webhook", "kafka"]
    for sink in sinks:
        assert isinstance(sink, AlertSink)
        assert not sink.health().ready  # not started
        await sink.stop()  # safe without start()
        await sink.stop()


def test_unusable_runtime_settings_are_config_errors(tmp_path: Path) -> None:
    missing = str(tmp_path / "missing-ca.pem")
    with pytest.raises(ConfigError, match="TLS") as tls:
        MqttAlertSink(MqttSinkConfig(enabled=True, tls=True, ca_file=missing))
    assert missing not in str(tls.value)
    bad = WebhookSinkConfig(enabled=True, url="http://127.0.0.1:9/", secret=SecretStr("whsec_!!!not-base64"))
    with pytest.raises(ConfigError, match="whsec_") as secret:
        WebhookAlertSink(bad)
    assert "not-base64" not in str(secret.value)
