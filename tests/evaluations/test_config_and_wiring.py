"""The evaluations config (off by default, validated, secrets masked) and its wiring in the app."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from sidecar.app import build_hooks
from sidecar.config import dump_yaml, load_config
from sidecar.errors import ConfigError
from sidecar.evaluations.langfuse import LangfuseScoresSink
from sidecar.evaluations.otlp import OtlpEvaluationsSink
from sidecar.evaluations.phoenix import PhoenixAnnotationsSink


def test_off_by_default_and_nothing_wired() -> None:
    config = load_config(overrides={})
    assert not config.evaluations.enabled
    names = {s.name for s in build_hooks(config, CollectorRegistry()).sinks}
    assert not names & {"otlp", "langfuse", "phoenix"}


def test_each_enabled_sink_is_a_stage_sink_a_component_and_a_health_check() -> None:
    config = load_config(
        overrides={
            "evaluations": {
                "otlp": {"enabled": True, "headers": {"authorization": "Bearer s3cr3t-otlp"}},
                "langfuse": {"enabled": True, "public_key": "pk-lf", "secret_key": "s3cr3t-lf"},
                "phoenix": {"enabled": True, "api_key": "s3cr3t-px"},
            }
        }
    )
    out = build_hooks(config, CollectorRegistry())
    kinds = (OtlpEvaluationsSink, LangfuseScoresSink, PhoenixAnnotationsSink)
    for group in (out.sinks, out.components, out.health):
        assert [type(s) for s in group if isinstance(s, kinds)] == list(kinds)
    shown = dump_yaml(config)
    assert "s3cr3t" not in shown


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"langfuse": {"enabled": True}}, "public_key and secret_key"),
        ({"otlp": {"enabled": True, "endpoint": "collector:4318"}}, "http(s) URL"),
        ({"phoenix": {"enabled": True, "url": ""}}, "http(s) URL"),
        ({"otlp": {"delivery": {"max_batch_records": 0}}}, "max_batch_records"),
        ({"otlp": {"unknown": 1}}, "unknown"),
    ],
)
def test_invalid_settings_are_refused(overrides: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_config(overrides={"evaluations": overrides})
