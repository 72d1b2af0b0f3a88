"""The results topic's wire format is a contract (recovery, dashboards and other consumers read it):
these bytes were recorded from the processor and the results writer and must never change by accident.

Each case runs records through a ``PartitionProcessor`` into the real ``KafkaResultsWriter`` over a
producer that keeps what it is given, and compares the exact key and value bytes.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Mapping
from typing import Any

import msgspec
from aiokafka.errors import MessageSizeTooLargeError
from aiokafka.structs import RecordMetadata, TopicPartition
from prometheus_client import CollectorRegistry

from sidecar.source.config import KafkaConfig
from sidecar.source.journal import Recovery
from sidecar.source.journal_entry import JournalSigner, read_entry
from sidecar.source.processor import PartitionProcessor
from sidecar.source.result_record import ResultRecord
from sidecar.source.results import KafkaResultsWriter
from sidecar.source.writers import MAX_RESULT_BYTES
from sidecar.state.config import StateConfig
from sidecar.telemetry.stream_metrics import StreamMetrics
from tests.stream.fakes import FakeJournal, event, record


class _Builder:
    def __init__(self, sink: list[tuple[int, bytes, bytes]]) -> None:
        self._sink = sink
        self.items: list[tuple[bytes, bytes]] = []

    def append(self, *, timestamp: int | None, key: bytes, value: bytes) -> object:
        self.items.append((key, value))
        return object()

    def record_count(self) -> int:
        return len(self.items)


class _KeepingProducer:
    """What the results writer uses of AIOKafkaProducer; keeps (partition, key, value) of each record.

    With ``refuse_batches`` every batch is refused for its size, so each record goes through the
    single-record resend path (where a record the broker refuses again is shrunk).
    """

    def __init__(self, *, refuse_batches: bool = False, refuse_single_over: int | None = None) -> None:
        self.sent: list[tuple[int, bytes, bytes]] = []
        self._offset = 0
        self._refuse_batches = refuse_batches
        self._refuse_single_over = refuse_single_over

    def create_batch(self) -> _Builder:
        return _Builder(self.sent)

    async def partitions_for(self, topic: str) -> set[int]:
        return {0, 1, 2}

    def _ack(self, topic: str, partition: int, n: int) -> asyncio.Future[RecordMetadata]:
        done: asyncio.Future[RecordMetadata] = asyncio.get_running_loop().create_future()
        done.set_result(RecordMetadata(topic, partition, TopicPartition(topic, partition), self._offset, -1, -1, 0))
        self._offset += n
        return done

    async def send_batch(self, batch: _Builder, topic: str, *, partition: int) -> asyncio.Future[RecordMetadata]:
        if self._refuse_batches:
            raise MessageSizeTooLargeError()
        self.sent.extend((partition, k, v) for k, v in batch.items)
        return self._ack(topic, partition, len(batch.items))

    async def send(self, *, topic: str, partition: int, key: bytes, value: bytes) -> asyncio.Future[RecordMetadata]:
        if self._refuse_single_over is not None and len(value) > self._refuse_single_over:
            raise MessageSizeTooLargeError()
        self.sent.append((partition, key, value))
        return self._ack(topic, partition, 1)

    async def flush(self) -> None:
        return None


class _Hooks:
    """Answers each hook kind with the outcome given for it (a callable gets the context)."""

    def __init__(self, outcomes: Mapping[str, Any]) -> None:
        self._outcomes = outcomes

    def _answer(self, kind: str) -> Any:
        return self._outcomes[kind]

    def on_user_message(self, ctx: Any) -> Any:
        return self._answer("user_message")

    def on_turn_closed(self, ctx: Any) -> Any:
        return self._answer("turn_closed")

    async def _late(self, value: Any) -> Any:
        await asyncio.sleep(0)
        return value

    def on_conversation_ended(self, ctx: Any) -> Any:
        return self._late(self._answer("conversation_ended"))


async def _run(
    outcomes: Mapping[str, Any],
    *,
    keys: list[bytes] | None = None,
    partition: int = 4,
    producer: _KeepingProducer | None = None,
) -> list[tuple[int, bytes, bytes]]:
    producer = producer or _KeepingProducer()
    metrics = StreamMetrics(CollectorRegistry())
    cfg = KafkaConfig(
        bootstrap_servers="unused:9092",
        topic="agent.events",
        group_id="sidecar-g",
        results_topic="agent.events.results",
        dead_letter_topic="agent.events.dlq",
    )
    writer = KafkaResultsWriter(producer, cfg, metrics, JournalSigner(keys or []))  # type: ignore[arg-type]
    processor = PartitionProcessor(
        partition=partition,
        state_config=StateConfig(turn_debounce_seconds=5, idle_ttl_seconds=60),
        hooks=_Hooks(outcomes),
        results=writer,
        dead_letters=FakeJournal(),
        metrics=metrics,
        recovery=Recovery(0, 0, 0, 0),
        max_record_bytes=1 << 20,
        max_pending=64,
        clock=lambda: 0.0,
        wall_clock=lambda: 1_700_000_000.0,
    )
    evs = [
        event("conv-1", 0, "user", "hello"),
        event("conv-1", 1, "assistant", "hi"),
        event("conv-1", 2, "user", "book"),
        event("conv-1", 3, None, end=True),
    ]
    evs[0]["tenant"] = "acme"
    for i, ev in enumerate(evs):
        await processor.process(record(i, ev), 0.0, 1_700_000_000.0)
    assert await processor.drain(5.0)
    assert await writer.flush(partition, 5.0)
    return producer.sent


_PLAIN = {
    "user_message": {"recorded": True, "messages": 1},
    "turn_closed": {"p_end": 0.25, "n": None},
    "conversation_ended": {"scoring": {"p_end": 0.9, "nested": [1, 2.5, "x"]}},
}

_EXPECTED_PLAIN = [
    (
        1,
        b"conv-1",
        b'{"v":1,"partition":4,"position":0,"trigger":"record","kind":"user_message",'
        b'"conversation_id":"conv-1","turn":1,"close_reason":null,"end_reason":null,"agent":"a",'
        b'"tenant":"acme","messages":1,"outcome":{"recorded":true,"messages":1},'
        b'"group":"sidecar-g","topic":"agent.events"}',
    ),
    (
        1,
        b"conv-1",
        b'{"v":1,"partition":4,"position":2,"trigger":"record","kind":"turn_closed",'
        b'"conversation_id":"conv-1","turn":1,"close_reason":"next_user_message","end_reason":null,'
        b'"agent":"a","tenant":"acme","messages":2,"outcome":{"p_end":0.25,"n":null},'
        b'"group":"sidecar-g","topic":"agent.events"}',
    ),
    (
        1,
        b"conv-1",
        b'{"v":1,"partition":4,"position":2,"trigger":"record","kind":"user_message",'
        b'"conversation_id":"conv-1","turn":2,"close_reason":null,"end_reason":null,"agent":"a",'
        b'"tenant":"acme","messages":3,"outcome":{"recorded":true,"messages":1},'
        b'"group":"sidecar-g","topic":"agent.events"}',
    ),
    (
        1,
        b"conv-1",
        b'{"v":1,"partition":4,"position":3,"trigger":"record","kind":"turn_closed",'
        b'"conversation_id":"conv-1","turn":2,"close_reason":"conversation_end","end_reason":null,'
        b'"agent":"a","tenant":"acme","messages":3,"outcome":{"p_end":0.25,"n":null},'
        b'"group":"sidecar-g","topic":"agent.events"}',
    ),
    (
        1,
        b"conv-1",
        b'{"v":1,"partition":4,"position":3,"trigger":"record","kind":"conversation_ended",'
        b'"conversation_id":"conv-1","turn":2,"close_reason":null,"end_reason":"end_event",'
        b'"agent":"a","tenant":"acme","messages":3,"outcome":{"scoring":{"p_end":0.9,'
        b'"nested":[1,2.5,"x"]}},"group":"sidecar-g","topic":"agent.events"}',
    ),
]


async def test_plain_outcomes_keep_their_bytes() -> None:
    assert await _run(_PLAIN) == _EXPECTED_PLAIN


async def test_signed_records_keep_their_bytes() -> None:
    sent = await _run(_PLAIN, keys=[b"k1", b"k0"], partition=0)
    assert sent[0] == (
        0,
        b"conv-1",
        b'{"v":1,"partition":0,"position":0,"trigger":"record","kind":"user_message",'
        b'"conversation_id":"conv-1","turn":1,"close_reason":null,"end_reason":null,"agent":"a",'
        b'"tenant":"acme","messages":1,"outcome":{"recorded":true,"messages":1},'
        b'"group":"sidecar-g","topic":"agent.events",'
        b'"sig":"b7d18cac58848643d59b2995e1809aed6f44183ddb45e16886976c1b2478ecae"}',
    )
    assert len(sent) == 5


async def test_non_finite_unserialisable_and_oversized_outcomes_keep_their_bytes() -> None:
    outcomes = {
        "user_message": {"x": math.nan, "y": math.inf},
        "turn_closed": {"obj": object()},
        "conversation_ended": {"text": "x" * (MAX_RESULT_BYTES + 10)},
    }
    sent = await _run(outcomes)
    values = [v for _, _, v in sent]
    assert values[0].endswith(b'"messages":1,"outcome":{"x":null,"y":null},"group":"sidecar-g","topic":"agent.events"}')
    assert values[1] == (
        b'{"v":1,"partition":4,"position":2,"trigger":"record","kind":"turn_closed",'
        b'"conversation_id":"conv-1","turn":1,"close_reason":"next_user_message","end_reason":null,'
        b'"agent":"a","tenant":"acme","messages":2,"outcome":{"error":"result_unserialisable"},'
        b'"group":"sidecar-g","topic":"agent.events"}'
    )
    assert values[4] == (
        b'{"v":1,"partition":4,"position":3,"trigger":"record","kind":"conversation_ended",'
        b'"conversation_id":"conv-1","turn":2,"close_reason":null,"end_reason":"end_event",'
        b'"agent":"a","tenant":"acme","messages":3,"outcome":{"error":"result_too_large",'
        b'"bytes":524566},"group":"sidecar-g","topic":"agent.events"}'
    )


async def test_records_the_broker_refuses_are_shrunk_with_the_same_bytes() -> None:
    producer = _KeepingProducer(refuse_batches=True, refuse_single_over=600)
    sent = await _run({**_PLAIN, "conversation_ended": {"text": "y" * 400}}, keys=[b"k"], producer=producer)
    assert [v for _, _, v in sent][3:] == [
        b'{"v":1,"partition":4,"position":3,"trigger":"record","kind":"turn_closed","conversation_id":"conv-1",'
        b'"turn":2,"close_reason":"conversation_end","end_reason":null,"agent":"a","tenant":"acme","messages":3,'
        b'"outcome":{"p_end":0.25,"n":null},"group":"sidecar-g","topic":"agent.events",'
        b'"sig":"cb07f864491fc1bf3cc9a617a362124d314bb14135c720cbe8be147f1d9c54b5"}',
        b'{"v":1,"partition":4,"position":3,"trigger":"record","kind":"conversation_ended",'
        b'"conversation_id":"conv-1","turn":2,"close_reason":null,"end_reason":"end_event","agent":"a",'
        b'"tenant":"acme","messages":3,"outcome":{"error":"result_too_large","bytes":741},'
        b'"group":"sidecar-g","topic":"agent.events",'
        b'"sig":"4e2c27c868260ad9daf2a3f9d720e0b726c8ea77dd2a52b28f039b60db82e144"}',
    ]


async def test_the_reader_decodes_the_type_the_writer_encoded_and_back_to_the_same_bytes() -> None:
    signer = JournalSigner([b"k1", b"k0"])
    signed = await _run(_PLAIN, keys=[b"k1", b"k0"], partition=0)
    for _, _, value in [*_EXPECTED_PLAIN, *signed]:
        entry, reason = read_entry(value, signer if b'"sig"' in value else JournalSigner([]))
        assert reason is None and isinstance(entry, ResultRecord)
        assert msgspec.json.encode(entry) == value
    entry, _ = read_entry(signed[4][2], signer)
    assert entry is not None
    assert (entry.kind, entry.end_reason, entry.turn, entry.outcome) == (
        "conversation_ended",
        "end_event",
        2,
        {"scoring": {"p_end": 0.9, "nested": [1, 2.5, "x"]}},
    )
