"""The README's configuration and metrics tables are generated from the code and must match it."""

from __future__ import annotations

from tests.tools.reference_docs import README, config_reference, metrics_reference, render


def test_readme_references_are_current() -> None:
    text = README.read_text(encoding="utf-8")
    assert render(text) == text, "README is stale: run `.venv/bin/python -m tests.tools.reference_docs`"


def test_references_cover_every_section_and_metric() -> None:
    cfg = config_reference()
    for key in ("kafka.topic", "state.idle_ttl_seconds", "http.port", "logging.format", "scoring.enabled",
                "clustering.enabled"):
        assert f"`{key}`" in cfg
    metrics = metrics_reference()
    assert "`sidecar_events_consumed_total`" in metrics
    assert "`sidecar_events_dead_lettered_total` | counter | reason |" in metrics
