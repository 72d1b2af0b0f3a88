"""OpenTelemetry in: GenAI spans from the agents' own instrumentation become contract-v1 events.

Two doors feed the sidecar's events topic: :class:`~sidecar.otel.receiver.OtlpHttpReceiver`
(``POST /v1/traces``) and :class:`~sidecar.otel.bridge.OtlpKafkaBridge` (the Collector's kafka
exporter topic). Both share :class:`~sidecar.otel.ingest.OtelIngest` (dialects, history diffing,
deterministic event ids) and one producer. See docs/opentelemetry.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry

from sidecar.lifecycle import Component, HealthReporter
from sidecar.otel.config import OtelConfig
from sidecar.source.config import KafkaConfig


@dataclass
class OtelDoors:
    """The components the ``otel`` section asks for, in start order (the producer stops last)."""

    components: list[Component] = field(default_factory=list)
    health: list[HealthReporter] = field(default_factory=list)


def build_doors(config: OtelConfig, kafka: KafkaConfig, registry: CollectorRegistry) -> OtelDoors:
    """The receiver and/or the bridge, sharing one ingest (one history tracker) and one producer."""
    from sidecar.otel.bridge import OtlpKafkaBridge
    from sidecar.otel.ingest import OtelIngest
    from sidecar.otel.metrics import OtelMetrics
    from sidecar.otel.producer import OtelEventProducer
    from sidecar.otel.receiver import OtlpHttpReceiver

    out = OtelDoors()
    if not config.enabled:
        return out
    metrics = OtelMetrics(registry)
    ingest = OtelIngest(config, metrics, max_event_bytes=kafka.max_record_bytes)
    producer = OtelEventProducer(kafka)
    out.components.append(producer)
    if config.receiver.enabled:
        receiver = OtlpHttpReceiver(config.receiver, ingest, producer, metrics, events_topic=kafka.topic)
        out.components.append(receiver)
        out.health.append(receiver)
    if config.bridge.enabled:
        bridge = OtlpKafkaBridge(config.bridge, kafka, ingest, producer, metrics)
        out.components.append(bridge)
        out.health.append(bridge)
    return out


__all__ = ["OtelConfig", "OtelDoors", "build_doors"]
