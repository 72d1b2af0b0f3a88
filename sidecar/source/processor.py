"""Per-partition processing with exactly-once effects.

A :class:`PartitionProcessor` owns one source partition's conversations. For each record it
decodes, applies it to the state machine, and dispatches the hook calls it causes; each hook's
awaitable becomes a *pending effect* that pins the partition's commit point until its outcome is
acknowledged in the results topic (see :mod:`sidecar.source.journal`). Nothing here talks to Kafka
directly, so the same code runs under the real consumer and under unit tests.
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, replace

import structlog

from sidecar.contract import ConversationHooks, Effect, HookResult, Outcome, TurnContext, events_of, provenance_of
from sidecar.errors import DecodeError
from sidecar.events import Event, decode_event
from sidecar.source.fence import Fence, Unfenced
from sidecar.source.journal import (
    CommitPoint,
    DeadLetterWriter,
    Recovery,
    ResultsWriter,
    SourceRecord,
)
from sidecar.source.result_record import RESULT_VERSION, ResultProvenance, ResultRecord, TriggeredBy
from sidecar.stage.feedback import FeedbackContext, joined
from sidecar.stage.pipeline import PostScoreStage
from sidecar.state.config import StateConfig
from sidecar.state.conversation import Conversation
from sidecar.state.feedback import FeedbackMemory
from sidecar.state.memory import MemoryBudget
from sidecar.state.store import PartitionState, Rejected, Trigger
from sidecar.telemetry.stream_metrics import StreamMetrics, StreamMetricsCache
from sidecar.transcript.redact import redactor_for

log = structlog.get_logger(__name__)


@dataclass(slots=True, eq=False)
class _Pending:
    """One effect that pins the commit point until its outcome is acknowledged."""

    pid: int
    position: int
    first_offset: int
    journal_start: int
    created: float
    awaitable: Awaitable[Outcome] | None = None
    waiter: asyncio.Future[None] | None = None
    acked: asyncio.Future[int] | None = None


class PartitionProcessor:
    """State, hooks and commit bookkeeping of one source partition."""

    def __init__(
        self,
        *,
        partition: int,
        state_config: StateConfig,
        hooks: ConversationHooks,
        results: ResultsWriter,
        dead_letters: DeadLetterWriter,
        metrics: StreamMetrics,
        recovery: Recovery,
        max_record_bytes: int,
        max_pending: int,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        budget: MemoryBudget | None = None,
        stage: PostScoreStage | None = None,
        fence: Fence | None = None,
        epoch: int | None = None,
    ) -> None:
        self.partition = partition
        # Asked before every effect, journal write, dead letter and commit point: once this member
        # may have lost the partition (sidecar/source/fence.py) it does none of them.
        self._fence: Fence = fence or Unfenced()
        self._epoch = self._fence.epoch if epoch is None else epoch
        self.state = PartitionState(state_config, budget)
        self._redactor = redactor_for(state_config.redaction)
        for cid, first_offset in recovery.finished:
            self.state.remember_finished(cid, first_offset)
        self._hooks = hooks
        self._hook_fns: dict[str, Callable[[TurnContext], HookResult]] = {}
        self._stage = stage or PostScoreStage()
        self._results = results
        self._dlq = dead_letters
        self._metrics = metrics
        self._m = StreamMetricsCache(metrics)
        self._room: asyncio.Event | None = None
        self._max_record_bytes = max_record_bytes
        self._max_pending = max_pending
        self._clock = clock
        self._wall = wall_clock
        self.next_offset = recovery.start_offset
        self._replay_until = recovery.replay_until
        self._journal_end = recovery.journal_end
        # Conversations rebuilt by replay get the recovered journal start, not the current end:
        # journal_start must stay monotone in open order for commit_point()'s minimum to cover
        # every transition of every conversation opened at or after the committed offset.
        self._journal_from = recovery.journal_from
        self._keys = recovery.keys
        self._ended_at = recovery.ended_at
        self._feedback_done = recovery.feedback_positions
        self._feedback_memory = FeedbackMemory(state_config.finished_memory, self.state.hold)
        for event_id in recovery.feedback_ids:
            self._feedback_memory.remember(event_id)
        self._transitions = deque(recovery.transitions)
        self._last_journaled = recovery.last_position
        self._pending: dict[int, _Pending] = {}
        self._ids = itertools.count()

    # -- properties --------------------------------------------------------------------------

    @property
    def replaying(self) -> bool:
        """True while re-reading records whose effects were already recorded before a restart."""
        return self.next_offset < self._replay_until

    @property
    def pending_effects(self) -> int:
        return len(self._pending)

    @property
    def live(self) -> bool:
        """False once this member may have lost the partition: nothing more is written for it."""
        return self._fence.allows(self._epoch)

    # -- processing --------------------------------------------------------------------------

    async def process(self, record: SourceRecord, received_at: float, received_at_unix: float | None = None) -> None:
        """Apply one record; awaits only for room under the pending-effect bound, before applying it.

        ``received_at`` is the monotonic fetch time (latency metrics), ``received_at_unix`` the
        wall-clock one handed to hooks (``TurnContext.triggered_at_unix``); default: now.

        Cancellation-safe: the only await before the record changes the state is the wait for
        room, and ``next_offset`` moves past the record only once every effect it caused is pinned.
        A cancellation in between (a revoke, a shutdown) leaves the commit point at or below this
        record, so its effects fire again at the next owner unless the journal says they happened.
        """
        offset = record.offset
        if offset < self.next_offset:
            return  # delivered again after a seek: already applied
        await self._wait_for_room()
        if not self.live:
            return  # superseded: the next owner processes it
        self._apply_transitions(offset)
        replay = offset < self._replay_until
        (self._m.replayed if replay else self._m.consumed).inc()
        triggers: list[Trigger] = []
        feedback: FeedbackContext | None = None
        cid: str | None = None
        try:
            event = decode_event(record.value, record.key, max_bytes=self._max_record_bytes)
            cid = event.conversation_id
            if event.feedback is not None:
                # Feedback takes no seq and changes no conversation: checked here, applied below.
                feedback = self._accept_feedback(event, received_at_unix)
            else:
                if self._redactor is not None and event.message is not None:
                    event = replace(event, message=self._redactor.redact_message(event.message))
                # A conversation (re)opened from a record at or below the last position a previous
                # owner journaled an outcome for may have outcomes in the journal from J on: it must
                # keep the commit's journal start at J, or a later recovery would read past them and
                # fire again.
                jpos = self._journal_from if replay or offset <= self._last_journaled else self._journal_end
                # The record's Kafka timestamp dates the conversation's start, durably across restarts.
                opened = record.timestamp / 1000.0 if record.timestamp > 0 else self._wall()
                triggers = self.state.apply(event, offset, self._clock(), jpos, opened)
        except (DecodeError, Rejected) as exc:
            if not replay and not self._finished_at_handover(exc.reason, cid, offset):
                self._dead_letter(record, exc.reason, exc.detail)
        wall = self._wall() if received_at_unix is None else received_at_unix
        for t in triggers:
            await self._fire(t, offset, "record", replay, received_at, wall=wall)
        if feedback is not None:
            await self._apply_feedback(feedback, offset, replay)
        self.next_offset = offset + 1
        if (self._keys or self._feedback_done or self._ended_at) and offset > self._last_journaled:
            self._keys = set()  # nothing recorded before the restart can trigger again
            self._feedback_done = set()
            self._ended_at = {}
        self._observe(received_at)

    def _finished_at_handover(self, reason: str, cid: str | None, offset: int) -> bool:
        """Whether a refused event is the tail of a conversation the journal shows finished at or
        after this record: a previous owner processed it; re-read from a start offset past the
        conversation's beginning, it looks like a gap. Skipped and counted, never dead-lettered."""
        if reason != "seq_gap" or cid is None or cid in self.state.conversations:
            return False
        end = self._ended_at.get(cid)
        if end is None or offset > end:
            return False
        self._metrics.events_skipped.labels("conversation_finished_at_handover").inc()
        log.debug("event.skipped", partition=self.partition, offset=offset, reason="conversation_finished_at_handover")
        return True

    def _accept_feedback(self, event: Event, received_at_unix: float | None) -> FeedbackContext:
        """Check a feedback event and take its id (pure, so a replay decides the same); raises
        :class:`Rejected` with the dead-letter reason."""
        target = self._feedback_memory.take(self.state, event)
        fb = target.feedback
        kind = None
        if fb.target == "alert":
            # Both guaranteed by the decoder for an alert target.
            assert fb.turn is not None
            assert fb.alert_id is not None
            kind = self._stage.feedback.resolve_alert(event.conversation_id, fb.turn, fb.alert_id)
            if kind is None:
                raise Rejected("unknown_alert", f"alert_id names no alert of this conversation at turn {fb.turn}")
        wall = self._wall() if received_at_unix is None else received_at_unix
        return FeedbackContext(event.conversation_id, event.event_id, target, kind, wall)

    async def _apply_feedback(self, ctx: FeedbackContext, position: int, replay: bool) -> None:
        """Apply accepted feedback once: not while replaying, not when the journal says it was."""
        if replay or position in self._feedback_done:
            self._m.suppressed("feedback").inc()
            # Applied before the restart; what it wrote to outlive the process may be missing.
            again = self._stage.feedback.recorded(ctx, again=True) if self.live else None
            if again is not None:
                written = self._written(again)
                entry = self._pin(position, None)
                entry.acked = written
                written.add_done_callback(lambda f: self._release(entry, f))
            return
        if not self.live:
            return
        try:
            outcome = self._stage.feedback.apply(ctx)
        except Exception as exc:  # a sink's bug: recorded as the outcome, the partition goes on
            log.warning("feedback.failed", conversation_id=ctx.conversation_id, error=type(exc).__name__)
            outcome = {"error": type(exc).__name__}
        self._m.fired("feedback").inc()
        entry = self._pin(position, None)
        record = ResultRecord(
            v=RESULT_VERSION,
            partition=self.partition,
            position=position,
            trigger="record",
            kind="feedback",
            conversation_id=ctx.conversation_id,
            turn=ctx.target.feedback.turn or 0,
            agent=ctx.target.agent,
            tenant=ctx.target.tenant,
            outcome=dict(outcome),
        )
        if not self.live:
            return
        acked = joined(
            await self._results.submit(self.partition, ctx.conversation_id, record),
            self._stage.feedback.recorded(ctx, again=False),
        )
        entry.acked = acked
        acked.add_done_callback(lambda f: self._release(entry, f))

    def _written(self, recorded: asyncio.Future[None]) -> asyncio.Future[int]:
        """A write with no journal record of its own, as a pin's acknowledgement: the journal's end."""
        done: asyncio.Future[int] = asyncio.get_running_loop().create_future()

        def settle(f: asyncio.Future[None]) -> None:
            if f.cancelled() or f.exception() is not None:
                done.cancel()
            else:
                done.set_result(self._journal_end - 1)

        recorded.add_done_callback(settle)
        return done

    async def process_unreadable(self, record: SourceRecord) -> None:
        """A record the client could not parse: dead-letter its position (``unreadable_record``)."""
        detail = str(getattr(record, "detail", "the Kafka client could not parse it"))
        if record.offset < self.next_offset:
            return
        await self._wait_for_room()
        if not self.live:
            return
        self._apply_transitions(record.offset)
        replay = record.offset < self._replay_until
        (self._m.replayed if replay else self._m.consumed).inc()
        if not replay:
            self._dead_letter(record, "unreadable_record", detail)
        self.next_offset = record.offset + 1

    async def tick(self) -> None:
        """Fire what time has made due (debounced turn closes, idle expiry). Not during replay."""
        if self.replaying:
            return
        await self._wait_for_room()
        if not self.live:
            return  # after a stall every timer looks due: the new owner's clock decides
        now = self._clock()
        wall = self._wall()
        for t in self.state.due(now, wall):
            await self._fire(t, self.next_offset, "timer", False, None, wall=wall)
        self._observe(None)

    def _observe(self, received_at: float | None) -> None:
        if received_at is not None:
            self._m.processing.observe(time.monotonic() - received_at)

    def _apply_transitions(self, upto: int) -> None:
        while self._transitions and self._transitions[0].position <= upto:
            t = self._transitions.popleft()
            if t.kind == "turn_closed":
                self.state.replay_close(t.conversation_id, t.turn)
            elif t.kind == "conversation_ended":
                self.state.replay_end(t.conversation_id)

    # -- effects -----------------------------------------------------------------------------

    async def _fire(
        self, t: Trigger, position: int, trigger: TriggeredBy, replay: bool, received_at: float | None, *, wall: float
    ) -> None:
        kind = t.kind
        m = self._m
        if kind == "conversation_ended" and t.end_reason is not None:
            m.ended(t.end_reason).inc()
        if replay or (self._keys and t.key in self._keys):
            m.suppressed(kind).inc()
            return
        if not self.live:
            return  # no hook, no sink, no journal write: the next owner fires it
        conv = t.conversation
        ctx = TurnContext(
            kind=kind,
            conversation_id=conv.conversation_id,
            turn=t.turn,
            messages=tuple(conv.messages[: t.message_count]),
            agent=conv.agent,
            tenant=conv.tenant,
            close_reason=t.close_reason,
            end_reason=t.end_reason,
            triggered_at_unix=wall,
            span=conv.span_before(t.message_count) if conv.spans else None,
        )
        hook = self._hook_fns.get(kind)
        if hook is None:
            hook = self._hook_fns[kind] = getattr(self._hooks, f"on_{kind}")
        try:
            result = hook(ctx)
        except Exception as exc:  # a hook that fails before returning: record the failure
            result = self._hook_failed(ctx, exc)
        m.fired(kind).inc()
        if received_at is not None:
            m.dispatch(kind).observe(time.monotonic() - received_at)
        # Pinned before any await: from here on a cancellation keeps the commit below it.
        entry = self._pin(position, conv)
        if isinstance(result, Mapping):
            staged = self._stage.offer(Effect(ctx, events_of(result), result))
            if staged is None:
                # Fast path: the outcome is known and every sink took it; only the journal write is pending.
                await self._journal(entry, ctx, result, position, trigger)
                return
            entry.waiter = asyncio.ensure_future(
                self._after_stage(entry, staged, ctx=ctx, outcome=result, position=position, trigger=trigger)
            )
        else:
            entry.awaitable = result
            entry.waiter = asyncio.ensure_future(self._complete(entry, result, ctx, position, trigger))

    async def _complete(
        self, entry: _Pending, aw: Awaitable[Outcome], ctx: TurnContext, position: int, trigger: TriggeredBy
    ) -> None:
        # Runs in its own task, whose context is a copy: binding here scopes to this effect.
        structlog.contextvars.bind_contextvars(conversation_id=ctx.conversation_id, turn=ctx.turn)
        try:
            outcome: Outcome = await aw
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            outcome = self._hook_failed(ctx, exc)
        if not self.live:
            return  # superseded while the hook ran: no sink sees it, the next owner redoes it
        staged = self._stage.offer(Effect(ctx, events_of(outcome), outcome))
        if staged is not None:
            await staged
        await self._journal(entry, ctx, outcome, position, trigger)

    async def _after_stage(
        self,
        entry: _Pending,
        staged: Awaitable[None],
        *,
        ctx: TurnContext,
        outcome: Outcome,
        position: int,
        trigger: TriggeredBy,
    ) -> None:
        await staged
        await self._journal(entry, ctx, outcome, position, trigger)

    def _hook_failed(self, ctx: TurnContext, exc: Exception) -> Outcome:
        self._m.hook_errors.labels(ctx.kind).inc()
        log.warning(
            "hook.failed", kind=ctx.kind, conversation_id=ctx.conversation_id, turn=ctx.turn, error=type(exc).__name__
        )
        return {"error": type(exc).__name__}

    async def _journal(
        self, entry: _Pending, ctx: TurnContext, outcome: Outcome, position: int, trigger: TriggeredBy
    ) -> None:
        if not self.live:
            return  # stays pinned and unwritten: the next owner redoes it from the journal
        record = ResultRecord(
            v=RESULT_VERSION,
            partition=self.partition,
            position=position,
            trigger=trigger,
            kind=ctx.kind,
            conversation_id=ctx.conversation_id,
            turn=ctx.turn,
            close_reason=ctx.close_reason,
            end_reason=ctx.end_reason,
            agent=ctx.agent,
            tenant=ctx.tenant,
            messages=len(ctx.messages),
            outcome=dict(outcome),
        )
        provenance = provenance_of(events_of(outcome))
        if provenance is not None:
            record.provenance = ResultProvenance.of(provenance)
        acked = await self._results.submit(self.partition, ctx.conversation_id, record)
        entry.acked = acked
        acked.add_done_callback(lambda f: self._release(entry, f))

    def _release(self, entry: _Pending, acked: asyncio.Future[int]) -> None:
        # Only an acknowledged outcome releases its pin; a cancelled or lost effect keeps the
        # commit point below its record, so that it fires again after a restart.
        if acked.cancelled():
            return
        self._journal_end = max(self._journal_end, acked.result() + 1)
        self._pending.pop(entry.pid, None)
        self._signal_room()

    def _signal_room(self) -> None:
        if self._room is not None and len(self._pending) < self._max_pending:
            self._room.set()

    def _pin(self, position: int, conv: Conversation | None) -> _Pending:
        pid = next(self._ids)
        first = conv.first_offset if conv is not None else position
        jstart = conv.journal_start if conv is not None else self._journal_end
        entry = _Pending(pid, position, first, jstart, time.monotonic())
        self._pending[pid] = entry
        return entry

    async def _wait_for_room(self) -> None:
        while len(self._pending) >= self._max_pending:
            self._room = asyncio.Event()
            await self._room.wait()

    def _dead_letter(self, record: SourceRecord, reason: str, detail: str) -> None:
        if not self.live:
            return
        self._m.dead(reason).inc()
        log.info("event.dead_lettered", partition=self.partition, offset=record.offset, reason=reason, detail=detail)
        entry = self._pin(record.offset, None)

        async def write() -> None:
            if not self.live:
                return  # stays pinned: the next owner dead-letters it
            try:
                await self._dlq.dead_letter(record, reason, detail)
            except Exception as exc:
                # Not a Kafka outage (those are retried inside): a copy that can never be written.
                # The record's position is logged so it is not lost silently, and the partition
                # goes on rather than stalling behind it forever.
                self._m.dead_letter_failures.inc()
                # A traceback adds nothing an operator can act on: the error's type is enough.
                log.error(  # noqa: TRY400
                    "event.dead_letter_failed",
                    partition=self.partition,
                    offset=record.offset,
                    reason=reason,
                    error=type(exc).__name__,
                )
            self._pending.pop(entry.pid, None)
            self._signal_room()

        entry.waiter = asyncio.ensure_future(write())

    # -- commits and shutdown ----------------------------------------------------------------

    def commit_point(self) -> CommitPoint | None:
        """Where this partition may commit now, or None while replaying or once superseded."""
        if self.replaying or not self.live:
            return None
        p = self.next_offset
        low = p
        j = self._journal_end
        for e in self._pending.values():
            p = min(p, e.position)
            low = min(low, e.first_offset)
            j = min(j, e.journal_start)
        oldest = self.state.oldest()
        if oldest is not None:
            low = min(low, oldest.first_offset)
            j = min(j, oldest.journal_start)
        return CommitPoint(
            offset=min(low, p), processed_until=p, journal_from=j, finished_from=self.state.finished_from()
        )

    async def drain(self, timeout_seconds: float) -> bool:
        """Wait up to ``timeout_seconds`` for pending effects; True if none is left. Ends early once
        the fence is up: a superseded member's effects are not acknowledged any more."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_seconds
        while self._pending and loop.time() < deadline and self.live:
            waits = {f for e in self._pending.values() for f in (e.waiter, e.acked) if f is not None and not f.done()}
            if not waits:
                await asyncio.sleep(0.01)
                continue
            await asyncio.wait(waits, timeout=max(0.0, deadline - loop.time()))
        return not self._pending

    async def abandon(self) -> None:
        """Cancel pending effects (they stay pinned, so they fire again after the next owner rebuilds).

        Journal writes already handed to the producer cannot be called back: :meth:`release`
        flushes them before the partition is given up, so that none lands after the next owner
        has read the journal.
        """
        tasks = [e.waiter for e in self._pending.values() if e.waiter is not None and not e.waiter.done()]
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        for e in self._pending.values():
            # An effect cancelled before its task ever ran leaves its hook's coroutine unstarted.
            if inspect.iscoroutine(e.awaitable) and inspect.getcoroutinestate(e.awaitable) == "CORO_CREATED":
                e.awaitable.close()

    async def release(self, grace_seconds: float, flush_timeout_seconds: float) -> CommitPoint | None:
        """Give the partition up: finish what can finish within ``grace_seconds``, abandon the rest,
        make sure no journal write of this owner can land later, and return the commit point.

        A write still unacknowledged after ``flush_timeout_seconds`` (brokers unreachable) may
        land after the next owner read the journal and then repeat an effect: that is counted
        (``sidecar_release_unflushed_total``) and logged; the commit point is returned anyway,
        since it never covers an unacknowledged effect.
        """
        if self.live:
            await self.drain(grace_seconds)
        if not self.live:
            # Superseded (maybe during the grace period): flushing now could land writes after the
            # next owner read the journal, so what is not acknowledged yet is abandoned instead.
            await self.release_fenced()
            return None
        await self.abandon()
        if not await self._results.flush(self.partition, flush_timeout_seconds):
            self._metrics.release_unflushed.inc()
            log.warning("partition.release_unflushed", partition=self.partition)
        point = self.commit_point()
        self.state.close()
        return point

    async def release_fenced(self) -> None:
        """Give up a partition this member may already have lost: no drain, no flush, no commit.

        Pending effects are abandoned (the next owner redoes them from the journal); waiting for
        them or flushing their journal writes would only let them land after the next owner read
        the journal, which is how a woken member would write an outcome twice.
        """
        await self.abandon()
        self.state.close()

    def oldest_pending_age(self, now: float) -> float:
        """Seconds the oldest effect still pinning the commit point has waited (0 if none)."""
        oldest = next(iter(self._pending.values()), None)
        return 0.0 if oldest is None else max(0.0, now - oldest.created)
