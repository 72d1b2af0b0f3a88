"""Generate the configuration and metrics references in docs/ from the code.

``python -m tests.tools.reference_docs`` rewrites the marked sections of docs/configuration.md and
docs/metrics.md (``--check``: only report, exit 1 when one is stale);
``tests/tools/test_reference_docs.py`` fails when either is out of date.
"""

from __future__ import annotations

import importlib
import re
import sys
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry
from pydantic import BaseModel, SecretStr

from sidecar.config import SidecarConfig

DOCS = Path(__file__).resolve().parents[2] / "docs"
CONFIG_DOC = DOCS / "configuration.md"
METRICS_DOC = DOCS / "metrics.md"
METRIC_CLASSES = [
    "sidecar.telemetry.stream_metrics:StreamMetrics",
    "sidecar.telemetry.http:HttpMetrics",
    "sidecar.scoring.client:VllmMetrics",
    "sidecar.scoring.metrics:ScoringMetrics",
    "sidecar.scoring.drift:DriftMetrics",
    "sidecar.scoring.routes:RouteMetrics",
    "sidecar.clustering.metrics:ClusteringMetrics",
    "sidecar.clustering.metrics:FleetGoalMetrics",
    "sidecar.alerting.metrics:AlertMetrics",
    "sidecar.alerting.feedback:FeedbackMetrics",
    "sidecar.alerting.thresholds:ThresholdMetrics",
    "sidecar.judge.metrics:JudgeMetrics",
    "sidecar.telemetry.loop_lag:LoopLagMonitor",
    "sidecar.training_store.sink:TrainingStoreMetrics",
    "sidecar.evaluations.metrics:EvaluationMetrics",
    "sidecar.otel.metrics:OtelMetrics",
    "sidecar.fleet.leadership:Leadership",
    "sidecar.fleet.table:TableMetrics",
]


def _type_name(annotation: Any) -> str:
    plain = typing.get_origin(annotation) is None and hasattr(annotation, "__name__")
    text = annotation.__name__ if plain else str(annotation)
    text = text.replace("typing.", "").replace("pydantic.types.", "")
    return re.sub(r"<class '([\w.]+)'>", r"\1", text)


def _default(value: Any) -> str:
    if isinstance(value, SecretStr):
        return "(secret)"
    if value is None:
        return "—"
    if isinstance(value, BaseModel):
        return "(section)"
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _walk(model: type[BaseModel], prefix: str) -> list[tuple[str, str, str, str]]:
    rows: list[tuple[str, str, str, str]] = []
    for name, field in model.model_fields.items():
        ann = field.annotation
        path = f"{prefix}.{name}" if prefix else name
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            rows.extend(_walk(ann, path))
            continue
        default = field.get_default(call_default_factory=True)
        rows.append((path, _type_name(ann), _default(default), (field.description or "").replace("|", "\\|")))
    return rows


def config_reference() -> str:
    lines = ["| key | type | default | meaning |", "|---|---|---|---|"]
    for path, typ, default, desc in _walk(SidecarConfig, ""):
        env = "SIDECAR_" + "__".join(p.upper() for p in path.split("."))
        lines.append(f"| `{path}` (`{env}`) | `{typ}` | `{default}` | {desc} |")
    return "\n".join(lines)


def metrics_reference() -> str:
    registry = CollectorRegistry()
    for spec in METRIC_CLASSES:
        module, cls = spec.split(":")
        getattr(importlib.import_module(module), cls)(registry)
    rows = []
    for metric in registry.collect():
        labels: set[str] = set()
        for s in metric.samples:
            labels |= set(s.labels) - {"le", "quantile"}
        name = metric.name + ("_total" if metric.type == "counter" else "")
        rows.append((name, metric.type, ", ".join(sorted(labels)) or "—", metric.documentation.replace("|", "\\|")))
    # Label sets are only visible once a child exists; read them from the collectors instead.
    label_names = {}
    for collector in list(registry._collector_to_names):
        names = registry._collector_to_names[collector]
        for n in names:
            label_names[n] = ", ".join(getattr(collector, "_labelnames", ())) or "—"
    lines = ["| metric | type | labels | meaning |", "|---|---|---|---|"]
    for name, typ, _, doc in sorted(rows):
        lines.append(f"| `{name}` | {typ} | {label_names.get(name, '—')} | {doc} |")
    return "\n".join(lines)


# Marker name -> the file holding it and the function that renders its table.
SECTIONS: dict[str, tuple[Path, Callable[[], str]]] = {
    "config-reference": (CONFIG_DOC, config_reference),
    "metrics-reference": (METRICS_DOC, metrics_reference),
}


def render(text: str, path: Path) -> str:
    """``text`` (the content of ``path``) with every generated section that belongs to it filled in."""
    for name, (doc, fn) in SECTIONS.items():
        if doc != path:
            continue
        start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
        if start not in text or end not in text:
            raise SystemExit(f"{path.name} lacks the {start} ... {end} markers")
        before, rest = text.split(start, 1)
        _, after = rest.split(end, 1)
        text = f"{before}{start}\n{fn()}\n{end}{after}"
    return text


def documents() -> list[Path]:
    """The files that hold generated sections."""
    return sorted({doc for doc, _ in SECTIONS.values()})


def main() -> int:
    stale = []
    for path in documents():
        text = path.read_text(encoding="utf-8")
        new = render(text, path)
        if new != text:
            stale.append(path)
            if "--check" not in sys.argv:
                path.write_text(new, encoding="utf-8")
    if "--check" in sys.argv:
        for path in stale:
            print(f"stale: {path.relative_to(DOCS.parent)}", file=sys.stderr)
        return 1 if stale else 0
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
