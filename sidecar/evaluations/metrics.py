"""Prometheus metrics of the results-out sinks (closed label sets: sink and reason are fixed strings)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge


class EvaluationMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.delivered = Counter(
            "sidecar_evaluation_results_delivered_total",
            "Evaluation results the sink's destination accepted, by sink (otlp, langfuse, phoenix).",
            ["sink"],
            registry=registry,
        )
        self.failed = Counter(
            "sidecar_evaluation_results_failed_total",
            "Evaluation results refused for good and dropped, by sink and reason (http_<status>, error).",
            ["sink", "reason"],
            registry=registry,
        )
        self.retries = Counter(
            "sidecar_evaluation_delivery_retries_total",
            "Failed deliveries that will be retried, by sink and reason (http_<status>, timeout, transport).",
            ["sink", "reason"],
            registry=registry,
        )
        self.queue = Gauge(
            "sidecar_evaluation_queue_records",
            "Evaluation results waiting in the sink's bounded queue, read at scrape time.",
            ["sink"],
            registry=registry,
        )
        self.sink_up = Gauge(
            "sidecar_evaluation_sink_up",
            "1 while the sink reports itself ready (its last delivery accepted), read at scrape time.",
            ["sink"],
            registry=registry,
        )
