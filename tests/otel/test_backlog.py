"""Verdicts on the right span after a backlog: the bridge catches up on a topic whose model calls are
read out of order (several partitions, several polls), and every turn's verdict still carries the span
of the model call that produced the turn's last reply."""

from __future__ import annotations

import random
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

from aiokafka import TopicPartition
from prometheus_client import CollectorRegistry

from sidecar.events import Event, SpanRef
from sidecar.otel.bridge import OtlpKafkaBridge
from sidecar.otel.config import OtelConfig
from sidecar.otel.ingest import OtelIngest
from sidecar.otel.metrics import OtelMetrics
from sidecar.source.config import KafkaConfig
from sidecar.state.conversation import Conversation
from tests.otel.spans import chat_attrs, conversation, decoded, encode, make_span, model_calls, traces

TOPIC = "otlp_spans"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Producer:
    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes, bytes]] = []

    async def produce(self, topic: str, records: Sequence[tuple[bytes, bytes]], **_: Any) -> None:
        self.sent.extend((topic, k, v) for k, v in records)


def bridge(clock: Clock, registry: CollectorRegistry, **hold: float) -> tuple[OtlpKafkaBridge, Producer, OtelIngest]:
    config = OtelConfig.model_validate({"bridge": {"enabled": True}, "hold": hold})
    metrics = OtelMetrics(registry)
    ingest = OtelIngest(config, metrics, max_event_bytes=1 << 20, clock=clock)
    producer = Producer()
    kafka = KafkaConfig(bootstrap_servers="127.0.0.1:9", topic="events")
    return OtlpKafkaBridge(config.bridge, kafka, ingest, producer, metrics), producer, ingest  # type: ignore[arg-type]


def backlog(cid: str, turns: int, partitions: int, seed: int) -> tuple[list[list[SimpleNamespace]], list[Any]]:
    """A conversation's model calls, one trace each, spread over partitions and shuffled within each;
    returns the polls (a few records from each partition at a time) and the spans in call order."""
    calls = model_calls(conversation(turns, cid))
    spans = [
        make_span(chat_attrs("genai", call, cid), start=1_700_000_000_000_000_000 + i) for i, call in enumerate(calls)
    ]
    rng = random.Random(seed)
    order = list(range(len(spans)))
    rng.shuffle(order)
    per_partition: list[list[SimpleNamespace]] = [[] for _ in range(partitions)]
    for k, i in enumerate(order):
        p = k % partitions
        value = encode(traces([spans[i]]), "otlp_proto")
        per_partition[p].append(
            SimpleNamespace(topic=TOPIC, partition=p, offset=len(per_partition[p]), key=None, value=value)
        )
    polls: list[list[SimpleNamespace]] = []
    while any(per_partition):
        p = len(polls) % partitions  # one partition's next two records per poll
        if per_partition[p]:
            polls.append(per_partition[p][:2])
            per_partition[p] = per_partition[p][2:]
        else:
            polls.append([])
    return polls, spans


def verdict_spans(events: list[Event]) -> dict[int, SpanRef | None]:
    """What the sidecar's state does: the first copy of each event is applied, and a turn's verdict
    carries the span of its last message that carried one (``Conversation.span_before``)."""
    conv = Conversation("c", agent=None, tenant=None, first_offset=0, journal_start=0, now=0.0, opened_at_unix=0.0)
    applied: dict[int, Event] = {}
    for e in events:
        applied.setdefault(e.seq, e)
    assert sorted(applied) == list(range(len(applied)))
    out: dict[int, SpanRef | None] = {}
    for seq in sorted(applied):
        e = applied[seq]
        conv.note_span(seq, e.span)
        assert e.message is not None
        if e.message.role == "assistant":
            out[seq] = conv.span_before(seq + 1)
    return out


async def run_backlog(
    seed: int, **hold: float
) -> tuple[dict[int, SpanRef | None], dict[int, SpanRef], CollectorRegistry]:
    clock, registry = Clock(), CollectorRegistry()
    door, producer, _ = bridge(clock, registry, **hold)
    cid = f"backlog-{seed}"
    polls, spans = backlog(cid, turns=4, partitions=4, seed=seed)
    for poll in polls:
        await door.step(poll)
        clock.now += 0.05  # the catch-up reads a poll every few tens of milliseconds
    clock.now += 60.0
    await door.step([])  # whatever still waits is decided
    events = decoded((k, v) for _, k, v in producer.sent)
    history = conversation(4, cid)
    replies = [i for i, m in enumerate(history) if m["role"] == "assistant"]
    expected = {pos: SpanRef(spans[k].trace_id.hex(), spans[k].span_id.hex()) for k, pos in enumerate(replies)}
    return verdict_spans(events), expected, registry


async def test_every_verdict_lands_on_the_model_call_that_produced_its_reply() -> None:
    for seed in range(5):
        got, expected, registry = await run_backlog(seed)
        assert got == expected, seed
        # what waited got what it waited for; nothing expired
        assert registry.get_sample_value(
            "sidecar_otel_holds_total", {"wait": "earlier_calls", "outcome": "expired"}
        ) in (
            None,
            0.0,
        )


async def test_without_the_wait_a_backlog_puts_verdicts_on_later_calls() -> None:
    # The same backlogs with the wait off (how the bridge read them before): some verdicts land on a
    # later model call of the conversation. This is what the wait is for.
    wrong = 0
    for seed in range(5):
        got, expected, _ = await run_backlog(seed, earlier_calls_seconds=0.0)
        wrong += sum(got[pos] != span for pos, span in expected.items())
    assert wrong > 0


async def test_a_held_record_is_not_committed_past_and_an_expired_wait_decides_as_before() -> None:
    clock, registry = Clock(), CollectorRegistry()
    door, producer, ingest = bridge(clock, registry, earlier_calls_seconds=2.0)
    cid = "held-1"
    calls = model_calls(conversation(2, cid))
    spans = [make_span(chat_attrs("genai", call, cid), start=10 + i) for i, call in enumerate(calls)]
    last = SimpleNamespace(
        topic=TOPIC, partition=0, offset=7, key=None, value=encode(traces([spans[-1]]), "otlp_proto")
    )
    await door.step([last])
    assert producer.sent == []
    assert ingest.holding == 1
    tp = TopicPartition(TOPIC, 0)
    assert door.committable({tp: 8, TopicPartition(TOPIC, 1): 3}) == {tp: 7, TopicPartition(TOPIC, 1): 3}
    clock.now += 1.0
    assert not ingest.due("bridge")
    clock.now += 1.5
    assert ingest.due("bridge")
    await door.step([])
    events = decoded((k, v) for _, k, v in producer.sent)
    # decided as it was: the whole history from the one span read
    assert [e.seq for e in events] == list(range(len(calls[-1])))
    assert {e.span.span_id for e in events if e.span is not None} == {spans[-1].span_id.hex()}
    assert registry.get_sample_value("sidecar_otel_holds_total", {"wait": "earlier_calls", "outcome": "expired"}) == 1
    assert door.committable({tp: 8}) == {tp: 8}
    assert ingest.holding == 0
