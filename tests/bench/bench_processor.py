"""The streaming core's own CPU per record, without Kafka: where ``bench_stream``'s per-event cost goes.

``bench_stream`` times the whole sidecar against the mock cluster, so its per-event figure mixes
aiokafka's fetch parsing and producer with the sidecar's own work. This one feeds the same MultiWOZ
records straight into a ``PartitionProcessor`` (decode, state, exactly-once bookkeeping, hooks =
the no-op recorder, post-score stage, results journal through the real ``KafkaResultsWriter`` and
aiokafka's batch builder, over a producer that acknowledges at once) and prints CPU microseconds
per record, next to a baseline measured in the same run: decode each record with the sidecar's
decoder and append one small outcome per hook to an aiokafka batch builder (the work no sidecar can
skip).

Run: ``.venv/bin/python -m tests.bench.bench_processor [--events 60000] [--rounds 3]``
"""

from __future__ import annotations

import argparse
import asyncio
import time
from dataclasses import dataclass

import msgspec
from aiokafka.producer.message_accumulator import BatchBuilder
from aiokafka.structs import RecordMetadata, TopicPartition
from prometheus_client import CollectorRegistry

from sidecar.events import decode_event
from sidecar.source.config import KafkaConfig
from sidecar.source.journal import Recovery
from sidecar.source.journal_entry import JournalSigner
from sidecar.source.processor import PartitionProcessor
from sidecar.source.results import KafkaResultsWriter
from sidecar.state.config import StateConfig
from sidecar.state.hooks import RecordingHooks
from sidecar.telemetry.stream_metrics import StreamMetrics
from tests.bench.bench_stream import hooks_of, real_events
from tests.stream.fakes import FakeJournal

BATCH = 2000  # records handed to the processor between event-loop turns, as the worker does


@dataclass(frozen=True)
class _Record:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp: int


class _AckingProducer:
    """The part of AIOKafkaProducer the results writer uses; every batch is acknowledged at once."""

    def __init__(self) -> None:
        self._offset = 0

    def create_batch(self) -> BatchBuilder:
        return BatchBuilder(16384, 0)

    async def partitions_for(self, topic: str) -> set[int]:
        return {0, 1, 2, 3}

    async def send_batch(self, batch: BatchBuilder, topic: str, *, partition: int) -> asyncio.Future[RecordMetadata]:
        batch.close()
        done: asyncio.Future[RecordMetadata] = asyncio.get_running_loop().create_future()
        done.set_result(RecordMetadata(topic, partition, TopicPartition(topic, partition), self._offset, -1, -1, 0))
        self._offset += batch.record_count()
        return done


async def processor_cpu(records: list[_Record]) -> float:
    """CPU seconds per record through a PartitionProcessor."""
    metrics = StreamMetrics(CollectorRegistry())
    cfg = KafkaConfig(
        bootstrap_servers="unused:9092",
        topic="t",
        group_id="bench",
        results_topic="t.results",
        dead_letter_topic="t.dlq",
    )
    writer = KafkaResultsWriter(_AckingProducer(), cfg, metrics, JournalSigner([]))
    await writer.partition_count()
    processor = PartitionProcessor(
        partition=0,
        state_config=StateConfig(),
        hooks=RecordingHooks(),
        results=writer,
        dead_letters=FakeJournal(),
        metrics=metrics,
        recovery=Recovery(0, 0, 0, 0),
        max_record_bytes=1 << 20,
        max_pending=4096,
    )
    received = time.monotonic()
    t0 = time.process_time()
    for i in range(0, len(records), BATCH):
        for rec in records[i : i + BATCH]:
            await processor.process(rec, received, 0.0)
        await asyncio.sleep(0)  # the batch goes out, acknowledgements release the pins
    for _ in range(100):  # the last batch: shipped at the next loop turn, then acknowledged
        if not processor.pending_effects:
            break
        await asyncio.sleep(0)
    cpu = time.process_time() - t0
    if processor.pending_effects:
        raise SystemExit(f"{processor.pending_effects} effects still pending: the benchmark is broken")
    return cpu / len(records)


def baseline_cpu(records: list[_Record]) -> float:
    """CPU seconds per record for decode + one encoded outcome per hook appended to a batch builder."""
    encode = msgspec.json.Encoder().encode
    t0 = time.process_time()
    builder = BatchBuilder(16384, 0)
    for rec in records:
        ev = decode_event(rec.value, rec.key, max_bytes=1 << 20)
        for k in range(hooks_of(rec.value or b"{}")):
            value = encode(
                {"conversation_id": ev.conversation_id, "seq": ev.seq, "hook": k, "outcome": {"recorded": True}}
            )
            if builder.append(timestamp=None, key=rec.key, value=value) is None:
                builder = BatchBuilder(16384, 0)
                builder.append(timestamp=None, key=rec.key, value=value)
    return (time.process_time() - t0) / len(records)


def _baseline_hooks(records: list[_Record]) -> float:
    """hooks_of() json-parses each record: its own cost, subtracted from the baseline."""
    t0 = time.process_time()
    for rec in records:
        hooks_of(rec.value or b"{}")
    return (time.process_time() - t0) / len(records)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=60_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    records = [_Record("t", 0, i, k, v, 1_000) for i, (k, v) in enumerate(real_events(args.events))]
    side: list[float] = []
    base: list[float] = []
    for _ in range(args.rounds):
        side.append(asyncio.run(processor_cpu(records)))
        base.append(baseline_cpu(records) - _baseline_hooks(records))
    s, b = min(side), min(base)
    print(
        f"processor alone (no Kafka I/O): {s * 1e6:.1f} us CPU per record (best of {args.rounds}); "
        f"baseline decode + one outcome per hook into a batch builder: {b * 1e6:.1f} us -> ratio "
        f"{b / s:.2f}; {len(records)} MultiWOZ records"
    )


if __name__ == "__main__":
    main()
