"""One owned source partition: its bounded queue of fetched batches, recovery, and processing loop."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import structlog
from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition
from aiokafka.errors import KafkaError

from sidecar.contract import ConversationHooks
from sidecar.retry import Backoff
from sidecar.source.config import KafkaConfig
from sidecar.source.fence import Fence
from sidecar.source.journal import CommitPoint, DeadLetterWriter, Recovery
from sidecar.source.journal_entry import JournalSigner
from sidecar.source.processor import PartitionProcessor
from sidecar.source.recovery import JournalReader, load_recovery
from sidecar.source.results import KafkaResultsWriter
from sidecar.stage.pipeline import PostScoreStage
from sidecar.state.config import StateConfig
from sidecar.state.memory import MemoryBudget
from sidecar.telemetry.stream_metrics import StreamMetrics

log = structlog.get_logger(__name__)

RECOVERY_BACKOFF_INITIAL_SECONDS = 0.5
RECOVERY_BACKOFF_MAX_SECONDS = 30.0


@dataclass(frozen=True, slots=True)
class UnreadableRecord:
    """A source record the Kafka client could not parse (e.g. a header key that is not UTF-8).

    Only its position is known; it is dead-lettered as ``unreadable_record`` with that position in
    the headers, so that nothing is silently skipped."""

    topic: str
    partition: int
    offset: int
    detail: str
    key: bytes | None = None
    value: bytes | None = None
    timestamp: int = 0


@dataclass(frozen=True, slots=True)
class Batch:
    records: Sequence[ConsumerRecord[bytes, bytes] | UnreadableRecord]
    received_at: float
    received_at_unix: float
    size_bytes: int


@dataclass(frozen=True, slots=True)
class PartitionServices:
    """What a :class:`PartitionWorker` uses of the source that owns it, and nothing more.

    Built once by :class:`~sidecar.source.kafka.KafkaEventSource` and shared by all its workers:
    the clients recovery reads with, the writers and the hooks the processor needs, and the one
    call back into the source (``set_paused``: resume the partition once its queue has room).
    """

    cfg: KafkaConfig
    state_cfg: StateConfig
    hooks: ConversationHooks
    metrics: StreamMetrics
    stage: PostScoreStage
    budget: MemoryBudget
    consumer: AIOKafkaConsumer
    journal_reader: JournalReader
    signer: JournalSigner
    results: KafkaResultsWriter
    dead_letters: DeadLetterWriter
    count_journal_skip: Callable[[str], None]
    set_paused: Callable[[PartitionWorker, bool], None]
    fence: Fence


def batch_bytes(records: Sequence[ConsumerRecord[bytes, bytes]]) -> int:
    return sum(len(r.value or b"") + len(r.key or b"") for r in records)


class PartitionWorker:
    """Feeds one partition's fetched batches to its :class:`PartitionProcessor`.

    The queue is bounded twice: by batches and by bytes. ``offer`` never blocks the fetch loop;
    when either bound is reached it keeps the batch aside and asks for the partition to be paused,
    and the worker resumes it once it has caught up.
    """

    def __init__(self, tp: TopicPartition, services: PartitionServices) -> None:
        self.tp = tp
        self._services = services
        # The assignment this worker belongs to: its processor acts only while it is current.
        self.epoch = services.fence.epoch
        self.queue: asyncio.Queue[Batch] = asyncio.Queue(maxsize=services.cfg.partition_queue_batches)
        self.overflow: deque[Batch] = deque()
        self.queued_bytes = 0
        self.processor: PartitionProcessor | None = None
        self.task: asyncio.Task[None] | None = None
        # The commit point last sent to Kafka (None again after a failure, so it is re-sent).
        self.last_commit: CommitPoint | None = None
        # The offset Kafka last accepted for this partition (None until a commit succeeds), and
        # since when (monotonic) the partition has held records past it. Only a successful commit
        # that moves the offset, or having nothing uncommitted, restarts that clock: a failed
        # commit leaves it running, so repeated failures show as a growing commit age.
        self.committed_offset: int | None = None
        self.uncommitted_since = time.monotonic()
        self.paused = False
        # The offset after the last record handed to this worker: where fetching must resume if
        # the client loses records it had already parsed (see KafkaEventSource._isolate_unreadable).
        self.next_fetch: int | None = None

    def offer(self, batch: Batch) -> bool:
        """Queue a fetched batch; False means the partition must be paused."""
        if batch.records:
            self.next_fetch = batch.records[-1].offset + 1
        self.queued_bytes += batch.size_bytes
        over_bytes = self.queued_bytes > self._services.cfg.max_queued_bytes_per_partition
        if self.overflow or self.queue.full():
            self.overflow.append(batch)
            return False
        self.queue.put_nowait(batch)
        return not over_bytes

    async def _recover(self) -> Recovery:
        """Load the recovery plan, waiting out transient Kafka errors (capped, jittered backoff)."""
        src = self._services
        backoff = Backoff(RECOVERY_BACKOFF_INITIAL_SECONDS, RECOVERY_BACKOFF_MAX_SECONDS)
        while True:
            try:
                return await load_recovery(
                    src.consumer,
                    src.journal_reader,
                    src.cfg,
                    self.tp,
                    await src.results.partition_count(),
                    src.signer,
                    src.count_journal_skip,
                )
            except KafkaError as exc:
                src.metrics.recovery_errors.inc()
                delay = backoff.delay()
                log.warning(
                    "recovery.failed",
                    partition=self.tp.partition,
                    error=type(exc).__name__,
                    retry_in_seconds=round(delay, 2),
                )
                await asyncio.sleep(delay)

    async def run(self) -> None:
        src = self._services
        with structlog.contextvars.bound_contextvars(partition=self.tp.partition):
            began = time.monotonic()
            recovery = await self._recover()
            m = src.metrics
            m.recoveries.inc()
            m.recovery_seconds.observe(time.monotonic() - began)
            m.recovery_journal_records.inc(recovery.journal_records_read)
            if recovery.commit_metadata == "missing":
                m.recoveries_without_metadata.inc()
            self.processor = PartitionProcessor(
                partition=self.tp.partition,
                state_config=src.state_cfg,
                hooks=src.hooks,
                results=src.results,
                dead_letters=src.dead_letters,
                metrics=src.metrics,
                recovery=recovery,
                max_record_bytes=src.cfg.max_record_bytes,
                max_pending=src.cfg.max_pending_effects_per_partition,
                budget=src.budget,
                stage=src.stage,
                fence=src.fence,
                epoch=self.epoch,
            )
            self.uncommitted_since = time.monotonic()  # the time spent recovering is not a stalled commit
            sweep = src.state_cfg.sweep_interval_seconds
            next_tick = time.monotonic() + sweep
            while True:
                timeout = max(0.0, next_tick - time.monotonic())
                batch = None
                # Not asyncio.wait_for: on Python 3.11 it swallows a cancellation that arrives
                # as the batch does, and the worker would then outlive the source's stop.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(timeout):
                        batch = await self.queue.get()
                if batch is not None:
                    for rec in batch.records:
                        if isinstance(rec, UnreadableRecord):
                            await self.processor.process_unreadable(rec)
                        else:
                            await self.processor.process(rec, batch.received_at, batch.received_at_unix)
                    self.queued_bytes -= batch.size_bytes
                    self._refill()
                if time.monotonic() >= next_tick:
                    await self.processor.tick()
                    next_tick = time.monotonic() + sweep

    def _refill(self) -> None:
        while self.overflow and not self.queue.full():
            self.queue.put_nowait(self.overflow.popleft())
        room = self.queued_bytes <= self._services.cfg.max_queued_bytes_per_partition
        if not self.overflow and room and self.paused:
            self._services.set_paused(self, False)
