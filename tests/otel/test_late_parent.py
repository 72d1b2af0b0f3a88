"""A parent span exported after its model calls: the calls wait (``otel.hold.parent_seconds``) for the
span that carries the conversation id, then are decided as before (refused, counted)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse
from prometheus_client import CollectorRegistry

from sidecar.otel.config import OtelConfig, OtlpReceiverConfig
from sidecar.otel.ingest import OtelIngest
from sidecar.otel.metrics import OtelMetrics
from sidecar.otel.receiver import OtlpHttpReceiver
from tests.otel.conftest import refused
from tests.otel.spans import chat_attrs, conversation, decoded, encode, make_span, model_calls, new_id, traces
from tests.otel.test_backlog import Clock
from tests.otel.test_receiver import PROTO, RecordingProducer


def agent_trace(cid: str, turns: int = 1) -> tuple[Any, list[Any]]:
    """An app's invoke_agent span holding the conversation id, and its model calls (no id of their own)."""
    trace_id = new_id(16)
    parent = make_span({"gen_ai.operation.name": "invoke_agent", "gen_ai.conversation.id": cid}, trace_id=trace_id)
    calls = model_calls(conversation(turns, cid))
    children = [
        make_span(chat_attrs("genai", call, None), trace_id=trace_id, parent=parent.span_id, start=10 + i)
        for i, call in enumerate(calls)
    ]
    return parent, children


@pytest.fixture
async def door(
    registry: CollectorRegistry,
) -> AsyncIterator[tuple[httpx.AsyncClient, RecordingProducer, OtelIngest, Clock]]:
    clock = Clock()
    metrics = OtelMetrics(registry)
    ingest = OtelIngest(OtelConfig(hold={"parent_seconds": 3.0}), metrics, max_event_bytes=1 << 20, clock=clock)
    producer = RecordingProducer()
    cfg = OtlpReceiverConfig(enabled=True, host="127.0.0.1", port=0, allow_unauthenticated=True)
    receiver = OtlpHttpReceiver(cfg, ingest, producer, metrics, events_topic="events")  # type: ignore[arg-type]
    await receiver.start()
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{receiver.port}") as client:
            yield client, producer, ingest, clock
    finally:
        await receiver.stop()


async def post(client: httpx.AsyncClient, spans: list[Any]) -> ExportTraceServiceResponse:
    r = await client.post("/v1/traces", content=encode(traces(spans), "otlp_proto"), headers=PROTO)
    assert r.status_code == 200
    return ExportTraceServiceResponse.FromString(r.content)


async def test_calls_wait_for_a_parent_in_a_later_request(
    door: tuple[httpx.AsyncClient, RecordingProducer, OtelIngest, Clock], registry: CollectorRegistry
) -> None:
    client, producer, ingest, clock = door
    parent, children = agent_trace("late-1", turns=2)
    answer = await post(client, children)
    assert answer.partial_success.rejected_spans == 0
    assert producer.acked == []
    assert ingest.holding == len(children)
    clock.now += 2.0  # within the wait
    await post(client, [parent])
    events = decoded(producer.acked)
    # nothing lost: what the same spans give in one request
    at_once = OtelIngest(OtelConfig(), OtelMetrics(CollectorRegistry()), max_event_bytes=1 << 20)
    expected = decoded(at_once.derive(traces([parent, *children]), "x").records)
    assert [e.event_id for e in events] == [e.event_id for e in expected]
    assert [e.span for e in events] == [e.span for e in expected]
    assert {e.conversation_id for e in events} == {"late-1"}
    assert ingest.holding == 0
    assert refused(registry, "no_conversation_id", "receiver") == 0
    assert registry.get_sample_value("sidecar_otel_holds_total", {"wait": "parent", "outcome": "released"}) == len(
        children
    )


async def test_past_the_wait_the_calls_are_refused_and_counted(
    door: tuple[httpx.AsyncClient, RecordingProducer, OtelIngest, Clock], registry: CollectorRegistry
) -> None:
    client, producer, ingest, clock = door
    parent, children = agent_trace("late-2")
    await post(client, children)
    clock.now += 3.5
    # the door's own tick decides it; a request does too, whichever comes first
    await post(client, [])
    assert ingest.holding == 0
    assert refused(registry, "no_conversation_id", "receiver") == len(children)
    assert registry.get_sample_value("sidecar_otel_holds_total", {"wait": "parent", "outcome": "expired"}) == len(
        children
    )
    await post(client, [parent])  # too late: the parent alone is no model call
    assert producer.acked == []


async def test_a_stop_decides_what_is_held(registry: CollectorRegistry) -> None:
    _parent, children = agent_trace("late-3")
    metrics = OtelMetrics(registry)
    ingest = OtelIngest(OtelConfig(), metrics, max_event_bytes=1 << 20)
    producer = RecordingProducer()
    cfg = OtlpReceiverConfig(enabled=True, host="127.0.0.1", port=0, allow_unauthenticated=True)
    receiver = OtlpHttpReceiver(cfg, ingest, producer, metrics, events_topic="events")  # type: ignore[arg-type]
    await receiver.start()
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{receiver.port}") as client:
        await post(client, children)
    assert ingest.holding == len(children)
    await receiver.stop()
    assert ingest.holding == 0
    assert refused(registry, "no_conversation_id", "receiver") == len(children)


async def test_a_restarted_door_derives_the_same_ids() -> None:
    parent, children = agent_trace("late-4", turns=2)
    first = OtelIngest(OtelConfig(), OtelMetrics(CollectorRegistry()), max_event_bytes=1 << 20, clock=Clock())
    assert first.derive(traces(children), "receiver").records == []
    held = decoded(first.derive(traces([parent]), "receiver").records)
    again = OtelIngest(OtelConfig(), OtelMetrics(CollectorRegistry()), max_event_bytes=1 << 20)
    resent = decoded(again.derive(traces([parent, *children]), "receiver").records)
    assert [e.event_id for e in held] == [e.event_id for e in resent]
