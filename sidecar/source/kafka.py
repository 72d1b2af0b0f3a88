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
import time

import structlog
from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition
from aiokafka.abc import ConsumerRebalanceListener
from aiokafka.errors import (
    CommitFailedError,
    CorruptRecordException,
    IllegalGenerationError,
    KafkaError,
    UnknownMemberIdError,
)
from aiokafka.structs import OffsetAndMetadata

from sidecar.contract import ConversationHooks
from sidecar.fleet.leadership import Leadership
from sidecar.kafka_clients import client_kwargs
from sidecar.lifecycle import Health
from sidecar.source.capabilities import BrokerCapabilities
from sidecar.source.config import KafkaConfig
from sidecar.source.fence import FenceReason, MemberFence, group_term, request_rejoin, watchdog
from sidecar.source.group_errors import survivable_group_error
from sidecar.source.journal_entry import JournalSigner
from sidecar.source.recovery import JournalReader
from sidecar.source.results import KafkaResultsWriter
from sidecar.source.worker import Batch, PartitionServices, PartitionWorker, UnreadableRecord, batch_bytes
from sidecar.source.writers import KafkaDeadLetterWriter, make_producer
from sidecar.stage.pipeline import PostScoreStage
from sidecar.state.config import StateConfig
from sidecar.state.memory import MemoryBudget
from sidecar.telemetry.stream_metrics import StreamMetrics

log = structlog.get_logger(__name__)

POLL_TIMEOUT_MS = 200
# A parse failure inside the client (a header key that is not UTF-8, a corrupt batch) surfaces
# from getmany() with no record attached; these are the exceptions that mean "a record", not "the
# broker", and send the fetch loop into _isolate_unreadable.
UNREADABLE_ERRORS = (UnicodeDecodeError, CorruptRecordException)


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
        stage: PostScoreStage | None = None,
        *,
        capabilities: BrokerCapabilities | None = None,
        leadership: Leadership | None = None,
    ) -> None:
        self.cfg = cfg
        # What the start-up probe found (None when the source is built without one, in tests):
        # anything short of the full guarantee is named in /readyz.
        self.capabilities = capabilities
        # Told of every assignment and revoke: the owner of partition 0 is the fleet's leader.
        self.leadership = leadership
        self.state_cfg = state_cfg
        self.hooks = hooks
        self.metrics = metrics
        self.stage = stage or PostScoreStage(on_sink_error=lambda name: metrics.sink_errors.labels(name).inc())
        self.budget = MemoryBudget(state_cfg.max_memory_bytes)
        self.signer = JournalSigner([k.get_secret_value().encode() for k in cfg.journal_signing_keys])
        self.producer = make_producer(cfg, linger_ms=0)
        self.results = KafkaResultsWriter(self.producer, cfg, metrics, self.signer)
        self.dead_letters = KafkaDeadLetterWriter(self.producer, cfg, metrics, self.results.write_health)
        self.journal_reader = JournalReader(cfg)
        # Up once this member may have lost its partitions: a loop stall longer than it can go
        # without a heartbeat, or a coordinator that no longer holds the assignment's term.
        self.fence = MemberFence(
            (cfg.session_timeout_ms - cfg.heartbeat_interval_ms) / 1000,
            term=lambda: group_term(self.consumer),
            on_fenced=self._fenced,
        )
        self.results.fence = self.fence
        self.consumer = AIOKafkaConsumer(
            **client_kwargs(cfg),
            group_id=cfg.group_id,
            enable_auto_commit=False,
            auto_offset_reset=cfg.auto_offset_reset,
            max_poll_records=cfg.fetch_max_records,
            session_timeout_ms=cfg.session_timeout_ms,
            heartbeat_interval_ms=cfg.heartbeat_interval_ms,
            max_poll_interval_ms=cfg.max_poll_interval_ms,
            fetch_max_bytes=cfg.fetch_max_bytes,
            max_partition_fetch_bytes=min(cfg.fetch_max_bytes, max(cfg.max_record_bytes + 65_536, 1_048_576)),
            isolation_level="read_committed",
        )
        self._services = PartitionServices(
            cfg=cfg,
            state_cfg=state_cfg,
            hooks=hooks,
            metrics=metrics,
            stage=self.stage,
            budget=self.budget,
            consumer=self.consumer,
            journal_reader=self.journal_reader,
            signer=self.signer,
            results=self.results,
            dead_letters=self.dead_letters,
            count_journal_skip=self.count_journal_skip,
            set_paused=self.set_paused,
            fence=self.fence,
        )
        self._workers: dict[TopicPartition, PartitionWorker] = {}
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
        try:
            await self.consumer.start()
        except KafkaError as exc:
            if not survivable_group_error(exc):
                raise
            # Joined, not yet assigned: the coordinator rejoins; run() takes what it assigns.
            log.warning("kafka.group_error", error=str(exc), during="start")

    async def run(self) -> None:
        """Fetch, process and commit until cancelled."""
        try:
            async with asyncio.TaskGroup() as tg:
                self._tg = tg
                for w in self._workers.values():
                    if w.task is None:
                        w.task = tg.create_task(w.run(), name=f"partition-{w.tp.partition}")
                tg.create_task(watchdog(self.fence), name="watchdog")
                tg.create_task(self._commit_loop(), name="commit-loop")
                tg.create_task(self._fetch_loop(), name="fetch-loop")
        finally:
            # An assignment that arrives while the source shuts down (the consumer still answers
            # the group until stop()) must not create tasks in a finished group.
            self._tg = None

    async def stop(self) -> None:
        """Commit what is safe, leave the group, close clients. Idempotent, safe without start()."""
        if self._stopped:
            return
        self._stopped = True
        if self._started:
            with contextlib.suppress(KafkaError):
                await self.revoke(list(self._workers))
        # Built in __init__: closed even when start() never ran (else they leak their sessions).
        await self.consumer.stop()
        await self.journal_reader.stop()
        await self.producer.stop()

    def health(self) -> Health:
        """Ready when polling, every owned partition recovered, and results are being written.

        A replica that owns no partition is ready (a standby in a group with more replicas than
        partitions) unless ``kafka.ready_requires_partitions`` says otherwise; the detail says so.
        """
        assigned = len(self._workers)
        recovering = sum(1 for w in self._workers.values() if w.processor is None or w.processor.replaying)
        polling = time.monotonic() - self._last_poll < 30 if self._last_poll else False
        writing, write_detail = self.results.health()
        has_partitions = assigned > 0 or not self.cfg.ready_requires_partitions
        ready = self._started and not self._stopped and polling and has_partitions and recovering == 0 and writing
        detail = f"partitions={assigned} recovering={recovering} polling={polling}"
        if assigned == 0:
            detail += " standby"
        if not writing:
            detail += f" results={write_detail}"
        fenced = self.fence.reason if self._workers else None
        if fenced is not None:
            ready = False
            detail += f" fenced={fenced}"
        if self.cfg.processing_guarantee != "exactly_once":
            detail += f" guarantee={self.cfg.processing_guarantee}"
        if self.capabilities is not None and self.capabilities.summary():
            detail += " " + self.capabilities.summary()
        return Health("kafka", ready, detail)

    def count_journal_skip(self, reason: str) -> None:
        self.metrics.journal_skipped.labels(reason).inc()

    # -- rebalance ---------------------------------------------------------------------------

    def assign(self, assigned: list[TopicPartition]) -> None:
        # A new assignment, a new epoch: nothing of an earlier (possibly fenced) one acts again.
        self.fence.arm()
        for tp in assigned:
            if tp in self._workers:
                continue
            w = PartitionWorker(tp, self._services)
            self._workers[tp] = w
            if self._tg is not None:
                w.task = self._tg.create_task(w.run(), name=f"partition-{tp.partition}")
        self.metrics.partitions_assigned.set(len(self._workers))
        log.info("kafka.assigned", partitions=sorted(tp.partition for tp in assigned))
        if self.leadership is not None:
            generation, member_id = group_term(self.consumer)
            self.leadership.assigned({tp.partition for tp in self._workers}, generation, member_id)

    async def revoke(self, revoked: list[TopicPartition]) -> None:
        """Give partitions up: stop their workers, then release them together (one grace period,
        not one per partition), then commit what their releases allow."""
        if self.leadership is not None and revoked:
            self.leadership.revoked()  # a rebalance began: no jobs that must run once until it ends
        began = time.monotonic()
        workers = [w for tp in revoked if (w := self._workers.pop(tp, None)) is not None]
        stopping = {w.task for w in workers if w.task is not None}
        for task in stopping:
            task.cancel()
        if stopping:
            # asyncio.wait, not `await task` under suppress(CancelledError): that would also
            # swallow a cancellation of this revoke itself (the source's stop being cancelled).
            await asyncio.wait(stopping)
        if self.fence.fenced:
            await self._release_fenced(workers, began)
            return
        released = [w for w in workers if w.processor is not None]
        points = await asyncio.gather(
            *(
                w.processor.release(self.cfg.revoke_grace_seconds, self.cfg.revoke_flush_timeout_seconds)
                for w in released
                if w.processor is not None
            )
        )
        offsets = {
            w.tp: OffsetAndMetadata(cp.offset, cp.metadata)
            for w, cp in zip(released, points, strict=True)
            if cp is not None
        }
        if self.fence.fenced:  # superseded during the grace period: what is left is not written
            for w in workers:
                self.results.discard(w.tp.partition)
            offsets = {}
        self.metrics.partitions_assigned.set(len(self._workers))
        if offsets:
            await self._commit(offsets, self.cfg.revoke_flush_timeout_seconds)
        for tp in revoked:
            if tp not in self._workers:  # re-assigned meanwhile: its series belong to it again
                self.metrics.forget_partition(tp.partition)
        log.info(
            "kafka.revoked",
            partitions=sorted(tp.partition for tp in revoked),
            seconds=round(time.monotonic() - began, 3),
        )

    async def _release_fenced(self, workers: list[PartitionWorker], began: float) -> None:
        """Give up partitions this member may already have lost: abandon, drop unsent journal
        writes, commit nothing (the next owner redoes the pending effects from the journal)."""
        for w in workers:
            if w.processor is not None:
                await w.processor.release_fenced()
            self.results.discard(w.tp.partition)
        self.metrics.partitions_assigned.set(len(self._workers))
        for w in workers:
            if w.tp not in self._workers:
                self.metrics.forget_partition(w.tp.partition)
        log.info(
            "kafka.revoked",
            partitions=sorted(w.tp.partition for w in workers),
            seconds=round(time.monotonic() - began, 3),
            fenced=self.fence.reason,
        )

    def _fenced(self, reason: FenceReason) -> None:
        """The fence went up: count it, step down as leader, and ask the group for a new
        assignment (a member the coordinator still knows would otherwise keep partitions it no
        longer processes)."""
        self.metrics.members_fenced.labels(reason).inc()
        dropped = self.results.drop_unsent()
        if dropped:
            log.info("kafka.fenced_batches_dropped", batches=dropped)
        if self.leadership is not None:
            self.leadership.revoked()
        request_rejoin(self.consumer)

    # -- loops -------------------------------------------------------------------------------

    def set_paused(self, w: PartitionWorker, paused: bool) -> None:
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
            try:
                batches = await self.consumer.getmany(
                    timeout_ms=POLL_TIMEOUT_MS, max_records=self.cfg.fetch_max_records
                )
            except UNREADABLE_ERRORS as exc:
                await self._isolate_unreadable(exc)
                continue
            except KafkaError as exc:
                if not survivable_group_error(exc):
                    raise
                # Seen once; the next getmany() waits for records (no spin) while it rejoins.
                log.warning("kafka.group_error", error=str(exc), during="poll")
                continue
            self._deliver(batches)

    def _deliver(self, batches: dict[TopicPartition, list[ConsumerRecord[bytes, bytes]]]) -> None:
        now = time.monotonic()
        wall = time.time()
        self._last_poll = now
        for tp, records in batches.items():
            w = self._workers.get(tp)
            if w is not None and records and not w.offer(Batch(records, now, wall, batch_bytes(records))):
                self.set_paused(w, True)

    async def _isolate_unreadable(self, exc: BaseException) -> None:
        """Find the record the client could not parse, dead-letter its position, and go on.

        The client raises from getmany() without saying which partition, and it drops the records
        of that partition it had already parsed in the same call. So: rewind every partition to the
        offset after the last record its worker received, then fetch partition by partition; the
        one that raises again is read one record at a time, and the record at which it raises is
        handed to its worker as an :class:`UnreadableRecord` and skipped.
        """
        log.warning("kafka.unreadable_record", error=type(exc).__name__)
        for tp, w in list(self._workers.items()):
            if w.next_fetch is not None:
                self.consumer.seek(tp, w.next_fetch)
        for tp, w in list(self._workers.items()):
            if w.paused or self._workers.get(tp) is not w:
                continue
            while True:
                try:
                    batch = await self.consumer.getmany(tp, timeout_ms=POLL_TIMEOUT_MS, max_records=1)
                except UNREADABLE_ERRORS as again:
                    offset = w.next_fetch if w.next_fetch is not None else await self.consumer.position(tp)
                    detail = f"{type(again).__name__} in the Kafka client"
                    bad = UnreadableRecord(tp.topic, tp.partition, offset, detail)
                    if not w.offer(Batch([bad], time.monotonic(), time.time(), 0)):
                        self.set_paused(w, True)
                    self.consumer.seek(tp, offset + 1)
                    continue
                if not batch.get(tp):
                    break
                self._deliver(batch)
                if w.paused:
                    break

    async def _commit_loop(self) -> None:
        while True:
            await asyncio.sleep(self.cfg.commit_interval_seconds)
            await self.commit_now()

    async def commit_now(self) -> None:
        """Commit every partition whose commit point moved; refresh the gauges."""
        offsets: dict[TopicPartition, OffsetAndMetadata] = {}
        active = pending = 0
        now = time.monotonic()
        wall = time.time()
        effect_age = 0.0
        m = self.metrics
        for tp, w in list(self._workers.items()):
            p = w.processor
            if p is None:
                continue
            part = str(tp.partition)
            active += len(p.state)
            pending += p.pending_effects
            hw = self.consumer.highwater(tp)
            if hw is not None:
                m.consumer_lag.labels(part).set(max(0, hw - p.next_offset))
            oldest = p.state.oldest()
            m.oldest_conversation_age.labels(part).set(max(0.0, wall - oldest.opened_at_unix) if oldest else 0.0)
            effect_age = max(effect_age, p.oldest_pending_age(now))
            cp = p.commit_point()
            if cp is not None and cp != w.last_commit:
                offsets[tp] = OffsetAndMetadata(cp.offset, cp.metadata)
                w.last_commit = cp
        m.conversations_active.set(active)
        m.state_bytes.set(self.budget.used_bytes)
        m.effects_pending.set(pending)
        m.oldest_effect_age.set(effect_age)
        if offsets:
            await self._commit(offsets, self.cfg.request_timeout_ms / 1000)
        self._set_commit_ages()

    def _set_commit_ages(self) -> None:
        """Per owned partition, how long it has held records past its committed offset (after this
        round's commit, so a commit that just succeeded shows as 0)."""
        now = time.monotonic()
        for tp, w in list(self._workers.items()):
            p = w.processor
            if p is None:
                continue
            # During replay there is no commit point and nothing new to commit.
            uncommitted = not p.replaying and (w.committed_offset is None or w.committed_offset < p.next_offset)
            if not uncommitted:
                w.uncommitted_since = now
            self.metrics.commit_age.labels(str(tp.partition)).set(max(0.0, now - w.uncommitted_since))

    async def _commit(self, offsets: dict[TopicPartition, OffsetAndMetadata], timeout_seconds: float) -> None:
        try:
            # aiokafka retries a retriable commit error without end; bounded here, since a commit
            # that hangs in a revoke would hold the whole rebalance (and every partition) with it.
            async with asyncio.timeout(timeout_seconds):
                await self.consumer.commit(offsets)
        except (KafkaError, TimeoutError) as exc:
            if isinstance(exc, CommitFailedError) and isinstance(
                exc.__cause__, (IllegalGenerationError, UnknownMemberIdError)
            ):
                self.fence.fence("commit_refused")
            # A commit lost to a rebalance is harmless: the next owner starts from the previous
            # commit and the journal keeps effects from repeating. Repeated failures are not: the
            # commit age keeps growing (see PartitionWorker.uncommitted_since) and the counter
            # feeds SidecarCommitsFailing.
            self.metrics.commits.labels("failed").inc()
            log.warning("kafka.commit_failed", error=type(exc).__name__)
            for tp in offsets:
                w = self._workers.get(tp)
                if w is not None:
                    w.last_commit = None
        else:
            self.metrics.commits.labels("ok").inc()
            now = time.monotonic()
            for tp, om in offsets.items():
                w = self._workers.get(tp)
                if w is not None and om.offset != w.committed_offset:
                    w.committed_offset = om.offset
                    w.uncommitted_since = now
