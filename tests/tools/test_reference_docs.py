"""The configuration and metrics references in docs/ are generated from the code and must match it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.tools.reference_docs import (
    CONFIG_DOC,
    METRICS_DOC,
    config_reference,
    documents,
    metrics_reference,
    render,
)


@pytest.mark.parametrize("path", documents(), ids=lambda p: p.name)
def test_references_are_current(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    assert render(text, path) == text, f"{path.name} is stale: run `.venv/bin/python -m tests.tools.reference_docs`"


def test_stale_table_is_detected() -> None:
    """The drift check can fail: a row missing from the committed table is put back by render()."""
    text = CONFIG_DOC.read_text(encoding="utf-8")
    row = next(line for line in text.splitlines() if line.startswith("| `kafka.topic`"))
    stale = text.replace(row + "\n", "", 1)
    assert render(stale, CONFIG_DOC) != stale
    assert render(stale, CONFIG_DOC) == text


def test_missing_markers_are_an_error() -> None:
    with pytest.raises(SystemExit, match="config-reference"):
        render("# Configuration reference\n\nno table here\n", CONFIG_DOC)


def test_each_reference_lives_in_its_own_file() -> None:
    assert "<!-- config-reference:start -->" in CONFIG_DOC.read_text(encoding="utf-8")
    assert "<!-- metrics-reference:start -->" in METRICS_DOC.read_text(encoding="utf-8")
    assert "config-reference" not in METRICS_DOC.read_text(encoding="utf-8")


def test_references_cover_every_section_and_metric() -> None:
    cfg = config_reference()
    for key in (
        "kafka.topic",
        "state.idle_ttl_seconds",
        "http.port",
        "logging.format",
        "scoring.enabled",
        "clustering.enabled",
    ):
        assert f"`{key}`" in cfg
    metrics = metrics_reference()
    assert "`sidecar_events_consumed_total`" in metrics
    assert "`sidecar_events_dead_lettered_total` | counter | reason |" in metrics


def test_every_metric_the_service_defines_is_in_the_reference() -> None:
    """The reference is generated from a list of metric classes: a new class missing from that
    list would leave its families undocumented. Every ``"sidecar_..."`` family name written in the
    service's code must be in docs/metrics.md."""
    import re

    root = Path(__file__).resolve().parents[2] / "sidecar"
    defined = {
        name
        for path in root.rglob("*.py")
        if "tools" not in path.relative_to(root).parts
        for name in re.findall(
            r'(?:Counter|Gauge|Histogram|Enum|Info|HotCounter|HotHistogram)\(\s*"(sidecar_[a-z_]+)"',
            path.read_text(encoding="utf-8"),
        )
    }
    documented = METRICS_DOC.read_text(encoding="utf-8")
    assert defined, "the scan found no metric definitions"
    missing = sorted(n for n in defined if f"`{n}" not in documented)
    assert missing == []
