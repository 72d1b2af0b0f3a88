"""Metrics of the OpenTelemetry ingest (``sidecar_otel_*``; see docs/metrics.md). Labels are closed
sets: the door (``receiver``, ``bridge``), an outcome, a refusal reason from
:data:`sidecar.otel.errors.REASONS`, an HTTP status code. Never a conversation id."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge


class OtelMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.spans = Counter(
            "sidecar_otel_spans_total",
            "Spans read, by door and outcome (normalised: a chat span with its messages; end_signal: a span "
            "that ends its conversation; feedback: a sidecar.feedback span event, counted per event; ignored: "
            "none of these; refused: see sidecar_otel_refused_total).",
            ["door", "outcome"],
            registry=registry,
        )
        self.refused = Counter(
            "sidecar_otel_refused_total",
            "Payloads or spans that did not become events, by door and reason.",
            ["door", "reason"],
            registry=registry,
        )
        self.events = Counter(
            "sidecar_otel_events_produced_total",
            "Contract-v1 events derived from spans and acknowledged by Kafka, by door.",
            ["door"],
            registry=registry,
        )
        self.ends = Counter(
            "sidecar_otel_conversation_ends_total",
            "End-of-conversation signals read from spans, by door and outcome (emitted: a conversation_end "
            "event; repeated: its end was already derived; unknown_conversation: no history of it here since "
            "the door started, so nothing to place the end after; late_messages: a model call read after the "
            "end was derived, whose messages the sidecar dead-letters).",
            ["door", "outcome"],
            registry=registry,
        )
        self.histories = Counter(
            "sidecar_otel_histories_total",
            "Chat span histories by how they relate to what was seen of the conversation "
            "(new, extends, stale, rewritten).",
            ["kind"],
            registry=registry,
        )
        self.conversations = Gauge(
            "sidecar_otel_history_conversations",
            "Conversations whose history the ingest remembers.",
            registry=registry,
        )
        self.state_bytes = Gauge(
            "sidecar_otel_history_state_bytes",
            "Memory taken by the remembered histories (estimate).",
            registry=registry,
        )
        self.holds = Counter(
            "sidecar_otel_holds_total",
            "Spans held back before their decision, by what they waited for (parent: a parent span with the "
            "conversation id; earlier_calls: the model calls whose replies they read; logs: their content as "
            "OTLP log records; span: content from log records waiting for its span) and outcome (held: a span "
            "starts waiting; released: what it waited for came in time; expired: it did not, and the span was "
            "decided as it was; full: otel.hold.max_spans were held, so it was decided at once).",
            ["wait", "outcome"],
            registry=registry,
        )
        self.requests = Counter(
            "sidecar_otel_receiver_requests_total",
            "OTLP/HTTP export requests answered, by status code.",
            ["code"],
            registry=registry,
        )
        self.receiver_connections_refused = Counter(
            "sidecar_otel_receiver_connections_refused_total",
            "Connections to the OTLP receiver closed at once because max_connections, each with a request in "
            "progress, were already open.",
            registry=registry,
        )
        self.bridge_records = Counter(
            "sidecar_otel_bridge_records_total",
            "Records taken from the OTLP topic, by outcome (processed, dead_lettered).",
            ["outcome"],
            registry=registry,
        )
        self.produce_errors = Counter(
            "sidecar_otel_produce_errors_total",
            "Failed attempts to get derived events acknowledged by Kafka, by door.",
            ["door"],
            registry=registry,
        )
