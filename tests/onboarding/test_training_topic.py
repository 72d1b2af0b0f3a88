"""The training store's kafka backend: the sink (a recording producer) and the onboarding reader
(records handed to it directly), then both on librdkafka's mock cluster."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from aiokafka.errors import KafkaConnectionError
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry
from pydantic import ValidationError

from adapters.data.kafka_source import MAX_RECORD_BYTES
from adapters.data.sources import open_source, source_limits
from adapters.data.training_topic import TrainingTopicSource
from adapters.errors import DataError
from sidecar.config import SidecarConfig
from sidecar.contract import Effect, TurnContext
from sidecar.source.config import KafkaConfig
from sidecar.telemetry.labels import AgentLabels
from sidecar.training_store.config import TrainingStoreConfig
from sidecar.training_store.topic import KafkaTrainingStoreSink, record_key
from sidecar.transcript.model import Message, ToolCall
from tests.integration.kafka_support import produce_raw, read_topic

MESSAGES = (
    Message("system", "be nice"),
    Message("user", "book a table for <PERSON>"),
    Message("assistant", "", tool_calls=(ToolCall("book", '{"n": 2}'),)),
    Message("tool", "ok", name="book"),
    Message("assistant", "done, bye"),
)


class FakeProducer:
    """Records what is sent; ``fail`` makes every send raise it."""

    def __init__(self, fail: Exception | None = None, delay: float = 0.0) -> None:
        self.sent: list[tuple[str, bytes, bytes]] = []
        self.started = self.stopped = 0
        self.fail = fail
        self.delay = delay

    async def start(self) -> None:
        self.started += 1

    async def stop(self) -> None:
        self.stopped += 1

    async def send_and_wait(self, topic: str, value: bytes | None = None, key: bytes | None = None) -> object:
        await asyncio.sleep(self.delay)
        if self.fail is not None:
            raise self.fail
        assert value is not None and key is not None
        self.sent.append((topic, key, value))
        return None


def _ended(
    cid: str, agent: str | None = "shop", end_reason: str = "end_event", messages: tuple[Message, ...] = MESSAGES
) -> Effect:
    ctx = TurnContext("conversation_ended", cid, 1, messages, agent, "acme", end_reason=end_reason)  # type: ignore[arg-type]
    return Effect(ctx, (), {})


def _sink(
    producer: FakeProducer, *, redacted: bool = True, created: list[int] | None = None, **cfg: object
) -> tuple[KafkaTrainingStoreSink, CollectorRegistry]:
    registry = CollectorRegistry()
    config = TrainingStoreConfig.model_validate({"enabled": True, **cfg})

    async def create() -> bool:
        if created is not None:
            created.append(1)
        return True

    sink = KafkaTrainingStoreSink(
        config,
        KafkaConfig(bootstrap_servers="unused:9092", topic="events"),
        registry,
        AgentLabels(),
        redacted=redacted,
        producer_factory=lambda: producer,
        create_topic=create,
    )
    return sink, registry


async def _offer(sink: KafkaTrainingStoreSink, effect: Effect) -> None:
    wait = sink.offer(effect)
    if wait is not None:
        await wait


def _result(registry: CollectorRegistry, agent: str, result: str) -> float:
    return (
        registry.get_sample_value("sidecar_training_store_conversations_total", {"agent": agent, "result": result}) or 0
    )


def test_config_names_the_topic_after_the_source_and_keeps_it_apart() -> None:
    assert TrainingStoreConfig().topic_for("events") == "events.training"
    assert TrainingStoreConfig(topic="mine").topic_for("events") == "mine"
    with pytest.raises(ValidationError, match=r"training_store\.topic"):
        SidecarConfig.model_validate(
            {"kafka": {"topic": "ev"}, "training_store": {"enabled": True, "topic": "agent.conversations.dlq"}}
        )
    with pytest.raises(ValidationError):
        TrainingStoreConfig(topic="no spaces allowed")


async def test_one_record_per_conversation_keyed_agent_slash_id_in_the_file_schema() -> None:
    producer = FakeProducer()
    created: list[int] = []
    sink, registry = _sink(producer, created=created)
    await sink.start()
    await _offer(sink, _ended("c-1"))
    await _offer(sink, _ended("c-2", agent=None))
    await sink.stop()
    assert [(t, k) for t, k, _ in producer.sent] == [
        ("events.training", b"shop/c-1"),
        ("events.training", b"default/c-2"),
    ]
    record = json.loads(producer.sent[0][2])
    assert record["conversation_id"] == "c-1" and record["source"] == "shop"
    assert [t["role"] for t in record["turns"]] == ["system", "user", "assistant", "tool", "assistant"]
    assert "book" in json.dumps(record["turns"][2]["tool_calls"])
    # The state's redacted text is what is written, and the record says it was redacted.
    assert record["turns"][1]["content"] == "book a table for <PERSON>"
    assert record["meta"]["redacted"] is True and record["meta"]["end_reason"] == "end_event"
    assert created == [1] and producer.started == 1 and producer.stopped == 1
    assert _result(registry, "shop", "written") == 1
    assert sink.health().ready


async def test_a_repeated_effect_is_written_under_the_same_key_at_most_once_per_process() -> None:
    producer = FakeProducer()
    sink, registry = _sink(producer)
    await sink.start()
    for _ in range(3):
        await _offer(sink, _ended("c-1"))
    await sink.stop()
    assert [k for _, k, _ in producer.sent] == [record_key("shop", "c-1")]
    assert _result(registry, "shop", "duplicate") == 2
    # A second process (after a crash) writes it again under the same key: readers keep one.
    again = FakeProducer()
    other, _ = _sink(again)
    await other.start()
    await _offer(other, _ended("c-1"))
    await other.stop()
    assert again.sent[0][1] == producer.sent[0][1]


async def test_selection_end_reasons_size_and_agent_limit_are_counted_and_nothing_is_cut() -> None:
    producer = FakeProducer()
    sink, registry = _sink(producer, agents=["shop"], max_record_bytes=4096)
    await sink.start()
    await _offer(sink, _ended("other", agent="bank"))  # not selected: not ours, not counted
    await _offer(sink, _ended("cut", end_reason="evicted"))
    await _offer(sink, _ended("quiet", messages=(Message("system", "x"),)))
    await _offer(sink, _ended("big", messages=(Message("user", "x" * 5000),)))
    await _offer(sink, _ended("fits", messages=(Message("user", "x" * 3000),)))
    await sink.stop()
    assert [k for _, k, _ in producer.sent] == [b"shop/fits"]
    assert all(len(v) <= 4096 for _, _, v in producer.sent)
    assert _result(registry, "shop", "end_reason") == 1
    assert _result(registry, "shop", "too_short") == 1
    assert _result(registry, "shop", "too_large") == 1
    assert _result(registry, "bank", "end_reason") == 0

    limited, reg2 = _sink(FakeProducer(), max_agents=2)
    await limited.start()
    for agent in ("a", "b", "c", "a"):
        await _offer(limited, _ended(f"{agent}-1", agent=agent))
    await limited.stop()
    assert _result(reg2, "c", "agent_limit") == 1


async def test_a_broker_that_fails_or_never_answers_is_counted_and_the_effect_goes_on() -> None:
    sink, registry = _sink(FakeProducer(fail=KafkaConnectionError()))
    await sink.start()
    await _offer(sink, _ended("c-1"))
    assert _result(registry, "shop", "error") == 1
    assert not sink.health().ready and "KafkaConnectionError" in sink.health().detail
    await sink.stop()

    slow, reg2 = _sink(FakeProducer(delay=5.0), write_timeout_seconds=0.2)
    await slow.start()
    await asyncio.wait_for(_offer(slow, _ended("c-1")), 2)
    assert _result(reg2, "shop", "error") == 1 and "0.2s" in slow.health().detail
    await slow.stop()
    await slow.stop()  # idempotent


# -- the reader ----------------------------------------------------------------------------------


@dataclass
class Rec:
    key: bytes | None
    value: bytes | None


def _value(cid: str, agent: str = "shop", text: str = "hello") -> bytes:
    return json.dumps(
        {
            "conversation_id": cid,
            "source": agent,
            "turns": [{"role": "user", "content": text}, {"role": "assistant", "content": "ok"}],
            "meta": {"agent": agent, "split_group": cid},
        }
    ).encode()


def _reader(agent: str | None = "shop", newest: int | None = None, max_bytes: int = 1 << 30) -> TrainingTopicSource:
    return TrainingTopicSource("t", {}, "topic", agent, source_limits(max_bytes), newest)


def test_reader_keeps_the_newest_record_per_key_and_the_newest_n_per_agent() -> None:
    src = _reader(newest=3)
    for i in range(5):
        src.take(Rec(f"shop/c{i}".encode(), _value(f"c{i}", text=f"v{i}")))
    src.take(Rec(b"shop/c4", _value("c4", text="again")))  # a repeat: the newer record wins
    src.take(Rec(b"shop/c3", None))  # a tombstone withdraws it
    src.take(Rec(b"bank/c9", _value("c9", agent="bank")))
    got = list(src.held())
    assert [c.conversation_id for c in got] == ["c2", "c4"]
    assert got[1].messages[0].content == "again"
    assert src.counts == {"replaced": 1, "older_than_newest": 2, "other_agent": 1}
    assert src.stats.records == 2


@pytest.mark.parametrize(
    ("key", "value", "reason"),
    [
        (None, _value("c1"), "bad_key"),
        (b"no-slash", _value("c1"), "bad_key"),
        (b"shop/", _value("c1"), "bad_key"),
        (b"\xff\xfe/c1", _value("c1"), "bad_key"),
        (b"shop/" + b"x" * 2000, _value("c1"), "bad_key"),
        (b"shop/c1", b"{not json", "bad_json"),
        (b"shop/c1", b"[" * 100_000 + b"]" * 100_000, "bad_json"),
        (b"shop/c1", b"x" * (MAX_RECORD_BYTES + 1), "oversized"),
        (b"shop/c1", b'{"conversation_id": "c1", "turns": []}', "bad_messages"),
        (b"shop/c1", _value("c2"), "key_mismatch"),
        (b"shop/c1", _value("c1", agent="bank"), "key_mismatch"),
    ],
)
def test_reader_skips_hostile_records_with_a_reason(key: bytes | None, value: bytes, reason: str) -> None:
    src = _reader()
    src.take(Rec(key, value))
    src.take(Rec(b"shop/ok", _value("ok")))
    assert [c.conversation_id for c in src.held()] == ["ok"]
    assert src.stats.skipped == {reason: 1}


def test_reader_memory_is_bounded_by_held_bytes_not_by_the_topic() -> None:
    src = _reader(newest=2, max_bytes=2000)
    for i in range(200):  # far more than the byte bound in all, never more than two held
        src.take(Rec(f"shop/c{i}".encode(), _value(f"c{i}", text="y" * 400)))
    assert len(list(src.held())) == 2
    over = _reader(max_bytes=2000)
    for i in range(3):  # about 560 bytes each
        over.take(Rec(f"shop/c{i}".encode(), _value(f"c{i}", text="y" * 400)))
    with pytest.raises(DataError, match="--max-input-bytes"):
        over.take(Rec(b"shop/c3", _value("c3", text="y" * 400)))


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=64) | st.none(), st.binary(max_size=512) | st.none())
def test_reader_never_raises_on_arbitrary_records(key: bytes | None, value: bytes | None) -> None:
    src = _reader(agent=None)
    src.take(Rec(key, value))
    assert len(list(src.held())) <= 1


def test_specs_name_the_topic_or_take_it_from_the_sidecar_config(tmp_path: Path) -> None:
    src = open_source("kafka-training://h1:9092,h2:9092/fleet.training", agent="shop")
    assert isinstance(src, TrainingTopicSource)
    assert (src.topic, src.client["bootstrap_servers"], src.name) == ("fleet.training", "h1:9092,h2:9092", "shop")
    cfg = tmp_path / "sidecar.yaml"
    cfg.write_text("kafka:\n  bootstrap_servers: b:9092\n  topic: events\n")
    src = open_source("kafka-training:", sidecar_config=cfg, newest=7)
    assert isinstance(src, TrainingTopicSource)
    assert (src.topic, src.newest) == ("events.training", 7)
    with pytest.raises(DataError, match="--sidecar-config"):
        open_source("kafka-training:")
    with pytest.raises(DataError, match="kafka-training://HOST:PORT"):
        open_source("kafka-training://h1:9092")


# -- on librdkafka's mock cluster ------------------------------------------------------------------


async def test_written_by_two_sinks_read_once_per_conversation_on_the_mock_cluster(kafka: str) -> None:
    kcfg = KafkaConfig(bootstrap_servers=kafka, topic="mock-events", processing_guarantee="at_least_once")
    config = TrainingStoreConfig(enabled=True, replication_factor=1)
    sinks = [KafkaTrainingStoreSink(config, kcfg, CollectorRegistry(), AgentLabels(), redacted=False) for _ in range(2)]
    for s in sinks:
        await s.start()
    try:
        # Two replicas around a handover both finish c-3 and c-4; the rest once each.
        for i in range(6):
            await _offer(sinks[0], _ended(f"c-{i}"))
        for i in (3, 4):
            await _offer(sinks[1], _ended(f"c-{i}"))
        await _offer(sinks[1], _ended("b-1", agent="bank"))
    finally:
        for s in sinks:
            await s.stop()
    assert all(s.health().ready for s in sinks), [s.health() for s in sinks]
    # A hostile record on the same topic is skipped, not fatal.
    await produce_raw(kafka, "mock-events.training", [(b"shop/evil", b"\x00not json")])
    raw = await read_topic(kafka, "mock-events.training")
    assert len(raw) == 10

    src = open_source(f"kafka-training://{kafka}/mock-events.training", agent="shop")
    # The reader runs its own event loop, as the adapters command line does.
    got = [c.conversation_id for c in await asyncio.to_thread(lambda: list(src.conversations()))]
    assert sorted(got) == [f"c-{i}" for i in range(6)]
    described: dict[str, Any] = src.describe()
    assert described["malformed"] == 1 and described["conversations_skipped"]["replaced"] == 2
    missing = open_source(f"kafka-training://{kafka}/no-such-topic.training")
    with pytest.raises(DataError, match="not found"):
        await asyncio.to_thread(lambda: list(missing.conversations()))
