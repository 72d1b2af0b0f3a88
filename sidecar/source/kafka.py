"""``KafkaEventSource``: the consumer group member that feeds the partition processors.

Tasks (all supervised by one TaskGroup in :meth:`run`): the fetch loop, one worker per assigned
partition, and the commit loop. Backpressure: each partition has a bounded queue of fetched
batches; when it is full the partition is paused, and resumed once its worker catches up. The
fetch loop itself never blocks on processing, so the consumer keeps polling well inside
``max_poll_interval_ms`` however slow the hooks are.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import structlog
from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition
from aiokafka.abc import ConsumerRebalanceListener
from aiokafka.errors import KafkaError
from aiokafka.structs import OffsetAndMetadata

from sidecar.lifecycle import Health
from sidecar.source.config import KafkaConfig
from sidecar.source.journal import CommitPoint, Recovery
from sidecar.source.processor import PartitionProcessor
from sidecar.source.recovery import JournalReader, load_recovery
from sidecar.source.writers import KafkaDeadLetterWriter, KafkaResultsWriter, client_kwargs, make_producer
from sidecar.state.config import StateConfig
from sidecar.state.hooks import ConversationHooks
from sidecar.telemetry.stream_metrics import StreamMetrics

log = structlog.get_logger(__name__)

POLL_TIMEOUT_MS = 200
# On revoke, pending effects get this long to finish before they are abandoned (they then fire
# again at the partition's next owner). Kept well below session_timeout_ms so a rebalance
# completes before the group evicts this member.
REVOKE_GRACE_SECONDS = 2.0
RECOVERY_BACKOFF_INITIAL_SECONDS = 0.5
RECOVERY_BACKOFF_MAX_SECONDS = 30.0


@dataclass(frozen=True, slots=True)
class _Batch:
    records: Sequence[ConsumerRecord[bytes, bytes]]
    received_at: float
    received_at_unix: float


class _PartitionWorker:
    def __init__(self, tp: TopicPartition, source: KafkaEventSource) -> None:
        self.tp = tp
        self._source = source
        self.queue: asyncio.Queue[_Batch] = asyncio.Queue(maxsize=source.cfg.partition_queue_batches)
        self.overflow: deque[_Batch] = deque()
        self.processor: PartitionProcessor | None = None
        self.task: asyncio.Task[None] | None = None
        self.last_commit: CommitPoint | None = None
        self.paused = False

    def offer(self, batch: _Batch) -> bool:
        """Queue a fetched batch; False means the partition must be paused."""
        if self.overflow or self.queue.full():
            self.overflow.append(batch)
            return False
        self.queue.put_nowait(batch)
        return True

    async def _recover(self) -> Recovery:
        """Load the recovery plan, waiting out transient Kafka errors (capped, jittered backoff)."""
        src = self._source
        delay = RECOVERY_BACKOFF_INITIAL_SECONDS
        while True:
            try:
                return await load_recovery(
                    src.consumer, src.journal_reader, src.cfg, self.tp, await src.results.partition_count()
                )
            except KafkaError as exc:
                src.metrics.recovery_errors.inc()
                log.warning("recovery.failed", partition=self.tp.partition, error=type(exc).__name__,
                            retry_in_seconds=round(delay, 2))
                await asyncio.sleep(delay * (0.5 + random.random()))
                delay = min(delay * 2, RECOVERY_BACKOFF_MAX_SECONDS)

    async def run(self) -> None:
        src = self._source
        recovery = await self._recover()
        src.metrics.recoveries.inc()
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
        )
        sweep = src.state_cfg.sweep_interval_seconds
        next_tick = time.monotonic() + sweep
        with structlog.contextvars.bound_contextvars(partition=self.tp.partition):
            while True:
                timeout = max(0.0, next_tick - time.monotonic())
                try:
                    batch = await asyncio.wait_for(self.queue.get(), timeout)
                except TimeoutError:
                    batch = None
                if batch is not None:
                    for rec in batch.records:
                        await self.processor.process(rec, batch.received_at, batch.received_at_unix)
                    self._refill()
                if time.monotonic() >= next_tick:
                    await self.processor.tick()
                    next_tick = time.monotonic() + sweep

    def _refill(self) -> None:
        while self.overflow and not self.queue.full():
            self.queue.put_nowait(self.overflow.popleft())
        if not self.overflow and self.paused:
            self._source.set_paused(self, False)


class _Listener(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, source: KafkaEventSource) -> None:
        self._source = source

    async def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        await self._source.revoke(revoked)

    async def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        self._source.assign(assigned)


class KafkaEventSource:
    """Consumes the source topic and runs one :class:`PartitionProcessor` per owned partition."""

    def __init__(
        self,
        cfg: KafkaConfig,
        state_cfg: StateConfig,
        hooks: ConversationHooks,
        metrics: StreamMetrics,
    ) -> None:
        self.cfg = cfg
        self.state_cfg = state_cfg
        self.hooks = hooks
        self.metrics = metrics
        self.producer = make_producer(cfg)
        self.results = KafkaResultsWriter(self.producer, cfg, metrics)
        self.dead_letters = KafkaDeadLetterWriter(self.producer, cfg, metrics)
        self.journal_reader = JournalReader(cfg)
        self.consumer = AIOKafkaConsumer(
            **client_kwargs(cfg),
            group_id=cfg.group_id,
            enable_auto_commit=False,
            auto_offset_reset=cfg.auto_offset_reset,
            max_poll_records=cfg.fetch_max_records,
            session_timeout_ms=cfg.session_timeout_ms,
            heartbeat_interval_ms=cfg.heartbeat_interval_ms,
            max_poll_interval_ms=cfg.max_poll_interval_ms,
            isolation_level="read_committed",
        )
        self._workers: dict[TopicPartition, _PartitionWorker] = {}
        self._tg: asyncio.TaskGroup | None = None
        self._started = False
        self._stopped = False
        self._last_poll = 0.0

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        """Connect the producer and the journal reader (the consumer joins the group in run())."""
        if self._started:
            return
        self._started = True
        await self.producer.start()
        await self.journal_reader.start()
        self.consumer.subscribe([self.cfg.topic], listener=_Listener(self))
        await self.consumer.start()

    async def run(self) -> None:
        """Fetch, process and commit until cancelled."""
        async with asyncio.TaskGroup() as tg:
            self._tg = tg
            for w in self._workers.values():
                if w.task is None:
                    w.task = tg.create_task(w.run(), name=f"partition-{w.tp.partition}")
            tg.create_task(self._commit_loop(), name="commit-loop")
            tg.create_task(self._fetch_loop(), name="fetch-loop")

    async def stop(self) -> None:
        """Commit what is safe, leave the group, close clients. Idempotent, safe without start()."""
        if self._stopped or not self._started:
            self._stopped = True
            return
        self._stopped = True
        with contextlib.suppress(KafkaError):
            await self.revoke(list(self._workers))
        await self.consumer.stop()
        await self.journal_reader.stop()
        await self.producer.stop()

    def health(self) -> Health:
        assigned = len(self._workers)
        recovering = sum(1 for w in self._workers.values() if w.processor is None or w.processor.replaying)
        polling = time.monotonic() - self._last_poll < 30 if self._last_poll else False
        ready = self._started and not self._stopped and polling and assigned > 0 and recovering == 0
        return Health("kafka", ready, f"partitions={assigned} recovering={recovering} polling={polling}")

    # -- rebalance ---------------------------------------------------------------------------

    def assign(self, assigned: list[TopicPartition]) -> None:
        for tp in assigned:
            if tp in self._workers:
                continue
            w = _PartitionWorker(tp, self)
            self._workers[tp] = w
            if self._tg is not None:
                w.task = self._tg.create_task(w.run(), name=f"partition-{tp.partition}")
        self.metrics.partitions_assigned.set(len(self._workers))
        log.info("kafka.assigned", partitions=sorted(tp.partition for tp in assigned))

    async def revoke(self, revoked: list[TopicPartition]) -> None:
        offsets: dict[TopicPartition, OffsetAndMetadata] = {}
        for tp in revoked:
            w = self._workers.pop(tp, None)
            if w is None:
                continue
            if w.task is not None:
                w.task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await w.task
            if w.processor is not None:
                await w.processor.drain(REVOKE_GRACE_SECONDS)
                await w.processor.abandon()
                cp = w.processor.commit_point()
                if cp is not None:
                    offsets[tp] = OffsetAndMetadata(cp.offset, cp.metadata)
        self.metrics.partitions_assigned.set(len(self._workers))
        if offsets:
            await self._commit(offsets)
        log.info("kafka.revoked", partitions=sorted(tp.partition for tp in revoked))

    # -- loops -------------------------------------------------------------------------------

    def set_paused(self, w: _PartitionWorker, paused: bool) -> None:
        if w.paused == paused or w.tp not in self._workers:
            return
        w.paused = paused
        if paused:
            self.consumer.pause(w.tp)
        else:
            self.consumer.resume(w.tp)
        self.metrics.partitions_paused.set(sum(1 for x in self._workers.values() if x.paused))

    async def _fetch_loop(self) -> None:
        while True:
            batches = await self.consumer.getmany(timeout_ms=POLL_TIMEOUT_MS, max_records=self.cfg.fetch_max_records)
            now = time.monotonic()
            wall = time.time()
            self._last_poll = now
            for tp, records in batches.items():
                w = self._workers.get(tp)
                if w is not None and records and not w.offer(_Batch(records, now, wall)):
                    self.set_paused(w, True)

    async def _commit_loop(self) -> None:
        while True:
            await asyncio.sleep(self.cfg.commit_interval_seconds)
            await self.commit_now()

    async def commit_now(self) -> None:
        """Commit every partition whose commit point moved; refresh the gauges."""
        offsets: dict[TopicPartition, OffsetAndMetadata] = {}
        active = text = pending = 0
        for tp, w in list(self._workers.items()):
            p = w.processor
            if p is None:
                continue
            n, b = p.gauges()
            active += n
            text += b
            pending += p.pending_effects
            hw = self.consumer.highwater(tp)
            if hw is not None:
                self.metrics.consumer_lag.labels(str(tp.partition)).set(max(0, hw - p.next_offset))
            cp = p.commit_point()
            if cp is not None and cp != w.last_commit:
                offsets[tp] = OffsetAndMetadata(cp.offset, cp.metadata)
                w.last_commit = cp
        self.metrics.conversations_active.set(active)
        self.metrics.text_bytes.set(text)
        self.metrics.effects_pending.set(pending)
        if offsets:
            await self._commit(offsets)

    async def _commit(self, offsets: dict[TopicPartition, OffsetAndMetadata]) -> None:
        try:
            await self.consumer.commit(offsets)
        except KafkaError as exc:
            # A commit lost to a rebalance is harmless: the next owner starts from the previous
            # commit and the journal keeps effects from repeating.
            self.metrics.commits.labels("failed").inc()
            log.warning("kafka.commit_failed", error=type(exc).__name__)
            for tp in offsets:
                w = self._workers.get(tp)
                if w is not None:
                    w.last_commit = None
        else:
            self.metrics.commits.labels("ok").inc()
