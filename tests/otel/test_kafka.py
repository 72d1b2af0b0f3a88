"""Both doors against librdkafka's mock cluster: the events topic, after the sidecar's dedup by
event id, equals what a native producer would have written, through re-reads and re-sent data."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable

import httpx
import pytest
from prometheus_client import CollectorRegistry

from sidecar.otel.bridge import OtlpKafkaBridge
from sidecar.otel.config import OtelConfig, OtlpKafkaBridgeConfig, OtlpReceiverConfig
from sidecar.otel.ingest import OtelIngest
from sidecar.otel.metrics import OtelMetrics
from sidecar.otel.producer import OtelEventProducer
from sidecar.otel.receiver import OtlpHttpReceiver
from sidecar.source.config import KafkaConfig
from sidecar.tools.ports import free_port
from tests.integration.kafka_support import produce_raw, read_topic
from tests.otel.spans import (
    chat_attrs,
    conversation,
    decoded,
    dedup,
    encode,
    make_span,
    model_calls,
    native_events,
    new_id,
    traces,
)


def kafka_config(bootstrap: str, topic: str) -> KafkaConfig:
    return KafkaConfig(bootstrap_servers=bootstrap, topic=topic, request_timeout_ms=5000)


async def wait_for(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 60.0
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.1)


async def test_receiver_answers_after_kafka_acknowledged(kafka: str) -> None:
    topic = "otel-recv-events"
    registry = CollectorRegistry()
    metrics = OtelMetrics(registry)
    producer = OtelEventProducer(kafka_config(kafka, topic))
    receiver = OtlpHttpReceiver(
        OtlpReceiverConfig(enabled=True, host="127.0.0.1", port=0, allow_unauthenticated=True),
        OtelIngest(OtelConfig(), metrics, max_event_bytes=1 << 20),
        producer,
        metrics,
        events_topic=topic,
    )
    await receiver.start()
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{receiver.port}") as client:
            for call in model_calls(conversation(2)):
                body = encode(traces([make_span(chat_attrs("openinference", call, "r-1"))]), "otlp_proto")
                r = await client.post("/v1/traces", content=body, headers={"Content-Type": "application/x-protobuf"})
                assert r.status_code == 200
    finally:
        await receiver.stop()
        await producer.stop()
    # 200 came after the acknowledgement: the events are there already
    logs = dedup(decoded((r.key, r.value) for r in await read_topic(kafka, topic, idle_seconds=0.5)))
    assert [e.message for e in logs["r-1"]] == [e.message for e in native_events("r-1", conversation(2))]
    assert registry.get_sample_value("sidecar_otel_events_produced_total", {"door": "receiver"}) == 9


async def test_receiver_answers_503_when_kafka_is_unreachable() -> None:
    metrics = OtelMetrics(CollectorRegistry())
    producer = OtelEventProducer(kafka_config(f"127.0.0.1:{free_port()}", "nowhere"))
    cfg = OtlpReceiverConfig(
        enabled=True,
        host="127.0.0.1",
        port=0,
        allow_unauthenticated=True,
        produce_timeout_seconds=1.0,
        retry_after_seconds=7,
    )
    receiver = OtlpHttpReceiver(
        cfg, OtelIngest(OtelConfig(), metrics, max_event_bytes=1 << 20), producer, metrics, events_topic="nowhere"
    )
    await receiver.start()
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{receiver.port}") as client:
            body = encode(traces([make_span(chat_attrs("genai", conversation(1), "u-1"))]), "otlp_json")
            r = await client.post("/v1/traces", content=body, headers={"Content-Type": "application/json"})
    finally:
        await receiver.stop()
        await producer.stop()
    assert r.status_code == 503
    assert r.headers["Retry-After"] == "7"


def collector_records(histories: dict[str, list[dict[str, object]]], rng: random.Random) -> list[tuple[bytes, bytes]]:
    """Records as the Collector's kafka exporter writes them: each model call its own trace; some
    records one trace keyed by trace id (partition_traces_by_id), others a batch of several traces
    (unpartitioned, no key); both encodings; one conversation's traces end up on several partitions."""
    spans = []
    for i, (cid, history) in enumerate(histories.items()):
        dialect = ("genai", "genai_old", "openinference")[i % 3]
        for j, call in enumerate(model_calls(history)):
            trace = new_id(16)
            root = make_span(
                {
                    "gen_ai.operation.name": "invoke_agent",
                    "gen_ai.agent.name": "desk",
                    "gen_ai.conversation.id": cid,
                    "session.id": cid,
                },
                trace_id=trace,
                start=j * 10,
            )
            chat = make_span(chat_attrs(dialect, call, None), trace_id=trace, parent=root.span_id, start=j * 10 + 1)
            spans.append((trace, [root, chat]))
    rng.shuffle(spans)
    out: list[tuple[bytes, bytes]] = []
    while spans:
        encoding = rng.choice(["otlp_proto", "otlp_json"])
        if rng.random() < 0.5:
            trace, pair = spans.pop()
            out.append((trace.hex().encode(), encode(traces(pair), encoding)))
        else:
            batch = [spans.pop() for _ in range(min(len(spans), rng.randint(2, 5)))]
            out.append((None, encode(traces(s for _, pair in batch for s in pair), encoding)))  # type: ignore[arg-type]
    return out


def bridge_for(
    kafka: str, events: str, otlp: str, group: str
) -> tuple[OtlpKafkaBridge, OtelEventProducer, CollectorRegistry]:
    registry = CollectorRegistry()
    metrics = OtelMetrics(registry)
    cfg = OtlpKafkaBridgeConfig(
        enabled=True, topic=otlp, group_id=group, dead_letter_topic=f"{otlp}.dlq", fetch_max_records=7
    )
    kcfg = kafka_config(kafka, events)
    producer = OtelEventProducer(kcfg)
    ingest = OtelIngest(OtelConfig(), metrics, max_event_bytes=1 << 20)
    return OtlpKafkaBridge(cfg, kcfg, ingest, producer, metrics), producer, registry


def taken(registry: CollectorRegistry) -> float:
    return sum(
        registry.get_sample_value("sidecar_otel_bridge_records_total", {"outcome": o}) or 0
        for o in ("processed", "dead_lettered")
    )


@pytest.mark.slow
async def test_bridge_restart_and_resent_data_equal_the_ground_truth(kafka: str) -> None:
    rng = random.Random(7)
    events, otlp = "otel-bridge-events", "otel-bridge-otlp"
    histories = {f"b-{i}": conversation(rng.randint(1, 4), tag=str(i)) for i in range(12)}
    records = collector_records(histories, rng)
    garbage = [(b"junk", b"\x0a\xff\xff\xff"), (None, b"{not json")]
    first, resent = records[: len(records) // 2], records[len(records) // 2 :]
    await produce_raw(kafka, otlp, [*first, *garbage])

    bridge, producer, registry = bridge_for(kafka, events, otlp, "bridge-g")
    await bridge.start()
    try:
        await wait_for(lambda: taken(registry) >= len(first) + len(garbage))
        assert bridge.health().ready
    finally:
        await bridge.stop()
        await bridge.stop()
        await producer.stop()

    # Restart (the door's memory is gone), the rest arrives, and a Collector retry re-sends part of
    # the first half: the restarted bridge re-derives whole histories with the same event ids.
    await produce_raw(kafka, otlp, [*resent, *first[: len(first) // 2]])
    bridge, producer, registry = bridge_for(kafka, events, otlp, "bridge-g")
    await bridge.start()
    try:
        await wait_for(lambda: taken(registry) >= len(resent) + len(first) // 2)
    finally:
        await bridge.stop()
        await producer.stop()

    # A member that crashed before committing anything: another group re-reads the whole topic.
    bridge, producer, registry = bridge_for(kafka, events, otlp, "bridge-crashed")
    await bridge.start()
    try:
        await wait_for(lambda: taken(registry) >= len(records) + len(first) // 2 + len(garbage))
    finally:
        await bridge.stop()
        await producer.stop()

    inputs = await read_topic(kafka, otlp, idle_seconds=0.5)
    assert len({r.partition for r in inputs if r.key is not None}) > 1  # traces keyed by id: spread out
    produced = await read_topic(kafka, events, idle_seconds=0.5)
    assert len({r.partition for r in produced}) > 1
    for r in produced:
        assert r.key == decoded([(r.key, r.value)])[0].conversation_id.encode()
    logs = dedup(decoded((r.key, r.value) for r in produced))  # no seq taken twice, no gap
    assert set(logs) == set(histories)
    for cid, history in histories.items():
        assert [e.message for e in logs[cid]] == [e.message for e in native_events(cid, history)]
        assert {e.agent for e in logs[cid]} == {"desk"}
    dlq = await read_topic(kafka, f"{otlp}.dlq", idle_seconds=0.5)
    reasons = sorted(dict(r.headers)["dlq.reason"] for r in dlq)
    assert reasons.count(b"invalid_protobuf") >= 1
    assert reasons.count(b"invalid_json") >= 1
