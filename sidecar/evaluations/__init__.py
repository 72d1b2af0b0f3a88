"""Results out: each verdict as an evaluation result for OpenTelemetry backends, Langfuse, Phoenix.

:func:`build_sinks` makes the post-score sinks the configuration enables (none by default).
Imports are lazy, so a deployment that enables none never loads the OTLP protobuf classes.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from sidecar.evaluations.config import EvaluationsConfig
from sidecar.evaluations.sink import ResultsSink

__all__ = ["ResultsSink", "build_sinks"]


def build_sinks(cfg: EvaluationsConfig, registry: CollectorRegistry) -> list[ResultsSink]:
    """The enabled sinks in a fixed order (OTLP, Langfuse, Phoenix); none started."""
    if not cfg.enabled:
        return []
    from sidecar.evaluations.metrics import EvaluationMetrics

    metrics = EvaluationMetrics(registry)
    sinks: list[ResultsSink] = []
    if cfg.otlp.enabled:
        from sidecar.evaluations.otlp import OtlpEvaluationsSink

        sinks.append(OtlpEvaluationsSink(cfg.otlp, metrics, include_text=cfg.include_text))
    if cfg.langfuse.enabled:
        from sidecar.evaluations.langfuse import LangfuseScoresSink

        sinks.append(LangfuseScoresSink(cfg.langfuse, metrics, include_text=cfg.include_text))
    if cfg.phoenix.enabled:
        from sidecar.evaluations.phoenix import PhoenixAnnotationsSink

        sinks.append(PhoenixAnnotationsSink(cfg.phoenix, metrics, include_text=cfg.include_text))
    return sinks
