"""The official instrumentation's content modes through the bridge on a real broker: the booking
agent of ``test_e2e_openai_v2.py`` (``opentelemetry-instrumentation-openai-v2``, a fake OpenAI server
that answers with a tool call) in ``SPAN_ONLY`` (the control), ``EVENT_ONLY`` and ``SPAN_AND_EVENT``.
Its spans and log records, encoded by the OTLP exporter's own encoder, are written to a traces topic
and a logs topic of librdkafka's mock cluster as the Collector's kafka exporter writes them
(``otlp_proto``; traces keyed by trace id, one conversation over several partitions); the bridge
runs as the sidecar runs it (``build_doors``) and the events topic, after the sidecar's dedup,
equals a native producer's, message by message. In the late cases the logs topic is written only
after the bridge has read every span: in ``EVENT_ONLY`` the content-less model calls are held and
then joined to their content; in ``SPAN_AND_EVENT`` the late copies change nothing."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer
from prometheus_client import CollectorRegistry

from sidecar.otel import build_doors
from sidecar.otel.config import OtelConfig
from sidecar.source.config import KafkaConfig
from tests.integration.kafka_support import read_topic
from tests.otel.booking import AGENT, CONVERSATION, fake_openai_server, native_messages, run_booking_agent
from tests.otel.spans import decoded, dedup, native_events

pytest.importorskip("openai")
pytest.importorskip("opentelemetry.instrumentation.openai_v2")

WAIT_SECONDS = 60.0


async def wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_SECONDS
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.1)


def collector_traces(spans: Any) -> list[tuple[bytes, bytes]]:
    """The spans as the Collector's kafka exporter writes them with partition_traces_by_id: one
    record per trace, keyed by its id, ``otlp_proto``."""
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    by_trace: dict[int, list[Any]] = {}
    for span in spans:
        by_trace.setdefault(span.context.trace_id, []).append(span)
    return [(f"{t:032x}".encode(), encode_spans(group).SerializeToString()) for t, group in by_trace.items()]


def collector_logs(records: Any) -> list[bytes]:
    """The log records as the Collector's kafka exporter writes them (``otlp_proto``, unkeyed), one
    record per model call's content, so they can land on different partitions."""
    from opentelemetry.exporter.otlp.proto.common._log_encoder import encode_logs

    by_span: dict[tuple[int, int], list[Any]] = {}
    for r in records:
        by_span.setdefault((r.log_record.trace_id, r.log_record.span_id), []).append(r)
    return [encode_logs(group).SerializeToString() for group in by_span.values()]


async def write(bootstrap: str, topic: str, records: list[tuple[bytes | None, bytes]], *, spread: bool) -> set[int]:
    """Produce ``records`` with ``acks=all``; keyed ones go where the key hashes, unkeyed ones (with
    ``spread``) over the partitions in turn, last partition first. Returns the partitions written."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        partitions = sorted(await producer.partitions_for(topic), reverse=True)
        written = set()
        for i, (key, value) in enumerate(records):
            partition = partitions[i % len(partitions)] if spread and key is None else None
            meta = await (await producer.send(topic, value=value, key=key, partition=partition))
            written.add(meta.partition)
        return written
    finally:
        await producer.stop()


async def booking_records(
    mode: str, monkeypatch: pytest.MonkeyPatch
) -> tuple[list[dict[str, Any]], list[tuple[bytes, bytes]], list[bytes]]:
    """The booking agent's messages, and its traces and logs records for Kafka."""
    from opentelemetry.sdk._logs.export import InMemoryLogRecordExporter
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    span_exporter, log_exporter = InMemorySpanExporter(), InMemoryLogRecordExporter()
    async with fake_openai_server() as base_url:
        messages = await run_booking_agent(base_url, mode, monkeypatch, span_exporter, log_exporter)
    spans = collector_traces(span_exporter.get_finished_spans())
    logs = collector_logs(log_exporter.get_finished_logs())
    return messages, spans, logs


def bridge_config(group: str, traces_topic: str, logs_topic: str) -> OtelConfig:
    return OtelConfig.model_validate(
        {
            "bridge": {
                "enabled": True,
                "topic": traces_topic,
                "logs_topic": logs_topic,
                "group_id": group,
                "fetch_max_records": 1,  # one record per poll: spans and their content in different steps
            },
            # the late logs are written once every span was read: a wait they cannot miss
            "hold": {"logs_seconds": WAIT_SECONDS},
        }
    )


def value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return registry.get_sample_value(name, labels) or 0.0


@pytest.mark.parametrize(
    ("mode", "late_logs"),
    [
        ("SPAN_ONLY", False),
        ("EVENT_ONLY", False),
        ("SPAN_AND_EVENT", False),
        ("EVENT_ONLY", True),
        ("SPAN_AND_EVENT", True),
    ],
)
async def test_openai_v2_through_the_bridge_become_the_native_events(
    kafka: str, monkeypatch: pytest.MonkeyPatch, mode: str, late_logs: bool
) -> None:
    messages, spans, logs = await booking_records(mode, monkeypatch)
    if mode == "SPAN_ONLY":
        assert logs == []
    else:
        assert len(logs) == 3  # the content of each of the three model calls

    name = f"e2e-{mode.lower()}-{'late' if late_logs else 'early'}"
    traces_topic, logs_topic, events_topic = f"{name}-traces", f"{name}-logs", f"{name}-events"
    config = bridge_config(name, traces_topic, logs_topic)
    registry = CollectorRegistry()
    doors = build_doors(
        config, KafkaConfig(bootstrap_servers=kafka, topic=events_topic, request_timeout_ms=5000), registry
    )
    await write(kafka, traces_topic, list(spans), spread=False)
    if not late_logs:
        await write(kafka, logs_topic, [(None, v) for v in logs], spread=True)
    native = native_events(CONVERSATION, native_messages(messages))
    for component in doors.components:
        await component.start()
    try:

        def processed() -> float:
            return value(registry, "sidecar_otel_bridge_records_total", outcome="processed")

        if late_logs:
            await wait_for(lambda: processed() >= len(spans), "the spans to be read")
            if mode == "EVENT_ONLY":
                # the spans carry no content: the three model calls wait for their log records
                await wait_for(
                    lambda: value(registry, "sidecar_otel_holds_total", wait="logs", outcome="held") >= 3,
                    "the model calls to be held",
                )
                assert value(registry, "sidecar_otel_events_produced_total", door="bridge") == 0
            log_partitions = await write(kafka, logs_topic, [(None, v) for v in logs], spread=True)
            assert len(log_partitions) > 1
        await wait_for(lambda: processed() >= len(spans) + len(logs), "every record to be read")
        await wait_for(
            lambda: value(registry, "sidecar_otel_events_produced_total", door="bridge") >= len(native),
            "the events",
        )
        assert all(h.health().ready for h in doors.health)
    finally:
        for component in reversed(doors.components):
            await component.stop()

    produced = await read_topic(kafka, events_topic, idle_seconds=0.5)
    events = dedup(decoded((r.key, r.value) for r in produced))
    assert list(events) == [CONVERSATION]
    assert [e.message for e in events[CONVERSATION]] == [e.message for e in native]
    assert {e.agent for e in events[CONVERSATION]} == {AGENT}
    assert value(registry, "sidecar_otel_bridge_records_total", outcome="dead_lettered") == 0
    for reason in ("content_missing_capture_off", "content_on_logs_not_received", "no_conversation_id"):
        assert value(registry, "sidecar_otel_refused_total", door="bridge", reason=reason) == 0
    assert value(registry, "sidecar_otel_holds_total", wait="logs", outcome="expired") == 0
    assert value(registry, "sidecar_otel_holds_total", wait="span", outcome="expired") == 0
    held = value(registry, "sidecar_otel_holds_total", wait="logs", outcome="held")
    # every model call that waited for its content got it (read in this order, or the other way)
    assert value(registry, "sidecar_otel_holds_total", wait="logs", outcome="released") == held
    if mode == "EVENT_ONLY" and late_logs:
        assert held == 3
    if mode != "EVENT_ONLY":
        assert held == 0  # content on the span: nothing waits


@pytest.mark.slow
async def test_held_model_calls_are_held_again_after_a_restart(kafka: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """EVENT_ONLY: the bridge reads every span, holds the three model calls, and stops before their
    content comes. The held records were not committed past: the restarted bridge (its memory gone)
    reads them again, holds them again, and joins them to the log records written meanwhile."""
    messages, spans, logs = await booking_records("EVENT_ONLY", monkeypatch)
    name = "e2e-restart"
    traces_topic, logs_topic, events_topic = f"{name}-traces", f"{name}-logs", f"{name}-events"
    kafka_cfg = KafkaConfig(bootstrap_servers=kafka, topic=events_topic, request_timeout_ms=5000)
    await write(kafka, traces_topic, list(spans), spread=False)

    registry = CollectorRegistry()
    doors = build_doors(bridge_config(name, traces_topic, logs_topic), kafka_cfg, registry)
    for component in doors.components:
        await component.start()
    try:
        await wait_for(
            lambda: value(registry, "sidecar_otel_holds_total", wait="logs", outcome="held") >= 3,
            "the model calls to be held",
        )
    finally:
        for component in reversed(doors.components):
            await component.stop()
    assert value(registry, "sidecar_otel_events_produced_total", door="bridge") == 0

    await write(kafka, logs_topic, [(None, v) for v in logs], spread=True)
    native = native_events(CONVERSATION, native_messages(messages))
    registry = CollectorRegistry()
    doors = build_doors(bridge_config(name, traces_topic, logs_topic), kafka_cfg, registry)
    for component in doors.components:
        await component.start()
    try:
        await wait_for(
            lambda: value(registry, "sidecar_otel_events_produced_total", door="bridge") >= len(native), "the events"
        )
    finally:
        for component in reversed(doors.components):
            await component.stop()

    events = dedup(decoded((r.key, r.value) for r in await read_topic(kafka, events_topic, idle_seconds=0.5)))
    assert [e.message for e in events[CONVERSATION]] == [e.message for e in native]
    # the span records were read again after the restart (nothing past them had been committed)
    assert value(registry, "sidecar_otel_bridge_records_total", outcome="processed") == len(spans) + len(logs)
    assert value(registry, "sidecar_otel_holds_total", wait="logs", outcome="expired") == 0


@pytest.mark.slow
async def test_content_joined_to_a_held_model_call_survives_a_restart(
    kafka: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """EVENT_ONLY, a backlog read out of order: the second turn's trace and its content come first.
    Joined, its model call waits for the earlier calls (``earlier_calls``). The bridge stops there;
    the log record that held the call's content must not have been committed past, or the
    restarted bridge reads the span again without it and the turn is lost."""
    messages, spans, logs = await booking_records("EVENT_ONLY", monkeypatch)
    first_turn, second_turn = spans  # exported in the order the spans ended: the first turn's trace first
    name = "e2e-joined-restart"
    traces_topic, logs_topic, events_topic = f"{name}-traces", f"{name}-logs", f"{name}-events"
    kafka_cfg = KafkaConfig(bootstrap_servers=kafka, topic=events_topic, request_timeout_ms=5000)
    await write(kafka, traces_topic, [second_turn], spread=False)
    await write(kafka, logs_topic, [(None, logs[2])], spread=False)

    registry = CollectorRegistry()
    doors = build_doors(bridge_config(name, traces_topic, logs_topic), kafka_cfg, registry)
    for component in doors.components:
        await component.start()
    try:
        await wait_for(
            lambda: value(registry, "sidecar_otel_holds_total", wait="earlier_calls", outcome="held") >= 1,
            "the joined model call to wait for the earlier ones",  # it has its content: joined
        )
    finally:
        for component in reversed(doors.components):
            await component.stop()

    await write(kafka, traces_topic, [first_turn], spread=False)
    await write(kafka, logs_topic, [(None, logs[0]), (None, logs[1])], spread=False)
    native = native_events(CONVERSATION, native_messages(messages))
    registry = CollectorRegistry()
    doors = build_doors(bridge_config(name, traces_topic, logs_topic), kafka_cfg, registry)
    for component in doors.components:
        await component.start()
    try:
        await wait_for(
            lambda: value(registry, "sidecar_otel_events_produced_total", door="bridge") >= len(native), "the events"
        )
    finally:
        for component in reversed(doors.components):
            await component.stop()

    events = dedup(decoded((r.key, r.value) for r in await read_topic(kafka, events_topic, idle_seconds=0.5)))
    assert [e.message for e in events[CONVERSATION]] == [e.message for e in native]
    assert value(registry, "sidecar_otel_holds_total", wait="logs", outcome="expired") == 0
