"""Prometheus metrics of escalation (closed label sets: agent is bounded, kind/sink/outcome fixed)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

# From the user message (or the end) being seen to a sink accepting the alert: seconds to minutes.
LATENCY_BUCKETS = (0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1800)
SCORE_BUCKETS = (0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95, 0.975, 0.99, 1.0)


class AlertMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.uncertain_turns = Counter(
            "sidecar_uncertain_turns_total",
            "User turns the uncertainty policy flagged (alerting.policy.uncertainty).",
            ["agent"],
            registry=registry,
        )
        self.uncertainty_score = Histogram(
            "sidecar_uncertainty_score",
            "Relative uncertainty score of each tree: min of its rank in leaves and in low best-branch logprob.",
            ["agent"],
            buckets=SCORE_BUCKETS,
            registry=registry,
        )
        self.alerts = Counter(
            "sidecar_alerts_total",
            "Alerts by kind, sink and outcome (delivered, rejected).",
            ["kind", "sink", "outcome"],
            registry=registry,
        )
        self.suppressed = Counter(
            "sidecar_alerts_suppressed_total",
            "Alerts not sent, by kind and reason (rate_limit, no_sink).",
            ["kind", "reason"],
            registry=registry,
        )
        self.retries = Counter(
            "sidecar_alert_delivery_retries_total",
            "Failed alert deliveries that will be retried, by sink.",
            ["sink"],
            registry=registry,
        )
        self.latency = Histogram(
            "sidecar_escalation_latency_seconds",
            "From the trigger (user message or conversation end seen) to a sink accepting the alert.",
            ["kind", "sink"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.sink_up = Gauge(
            "sidecar_alert_sink_up",
            "1 while the sink reports itself ready (connected, last delivery accepted), read at scrape time.",
            ["sink"],
            registry=registry,
        )
        self.pending = Gauge(
            "sidecar_alerts_pending",
            "Alert deliveries waiting for a sink (outage backlog).",
            registry=registry,
        )
