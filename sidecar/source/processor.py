"""Per-partition processing with exactly-once effects.

A :class:`PartitionProcessor` owns one source partition's conversations. For each record it
decodes, applies it to the state machine, and dispatches the hook calls it causes; each hook's
awaitable becomes a *pending effect* that pins the partition's commit point until its outcome is
acknowledged in the results topic (see :mod:`sidecar.source.journal`). Nothing here talks to Kafka
directly, so the same code runs under the real consumer and under unit tests.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import structlog

from sidecar.errors import DecodeError
from sidecar.events import decode_event
from sidecar.source.journal import (
    RESULT_VERSION,
    CommitPoint,
    DeadLetterWriter,
    Recovery,
    ResultsWriter,
    SourceRecord,
)
from sidecar.state.config import StateConfig
from sidecar.state.conversation import Conversation
from sidecar.state.hooks import ConversationHooks, Outcome, TurnContext
from sidecar.state.store import PartitionState, Rejected, Trigger
from sidecar.telemetry.stream_metrics import StreamMetrics

log = structlog.get_logger(__name__)


@dataclass(slots=True)
class _Pending:
    position: int
    first_offset: int
    journal_start: int
    task: asyncio.Task[None] | None = None


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
    ) -> None:
        self.partition = partition
        self.state = PartitionState(state_config)
        self._hooks = hooks
        self._results = results
        self._dlq = dead_letters
        self._metrics = metrics
        self._max_record_bytes = max_record_bytes
        self._max_pending = max_pending
        self._clock = clock
        self.next_offset = recovery.start_offset
        self._replay_until = recovery.replay_until
        self._journal_end = recovery.journal_end
        # Conversations rebuilt by replay get the recovered journal start, not the current end:
        # journal_start must stay monotone in open order for commit_point()'s minimum to cover
        # every transition of every conversation opened at or after the committed offset.
        self._journal_from = recovery.journal_from
        self._keys = recovery.keys
        self._transitions = deque(recovery.transitions)
        self._last_journaled = max(
            [t.position for t in recovery.transitions] + [recovery.replay_until], default=0
        )
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

    # -- processing --------------------------------------------------------------------------

    async def process(self, record: SourceRecord, received_at: float) -> None:
        """Apply one record. Awaits only when the pending-effect bound is reached."""
        offset = record.offset
        if offset < self.next_offset:
            return  # delivered again after a seek: already applied
        self._apply_transitions(offset)
        replay = offset < self._replay_until
        (self._metrics.events_replayed if replay else self._metrics.events_consumed).inc()
        triggers: list[Trigger] = []
        try:
            event = decode_event(record.value, record.key, max_bytes=self._max_record_bytes)
            jpos = self._journal_from if replay else self._journal_end
            triggers = self.state.apply(event, offset, self._clock(), jpos)
        except (DecodeError, Rejected) as exc:
            if not replay:
                await self._dead_letter(record, exc.reason, exc.detail)
        self.next_offset = offset + 1
        for t in triggers:
            await self._fire(t, offset, "record", replay, received_at)
        if self._keys and self.next_offset > self._last_journaled:
            self._keys = set()  # nothing recorded before the restart can trigger again
        self._observe(received_at)

    async def tick(self) -> None:
        """Fire what time has made due (debounced turn closes, idle expiry). Not during replay."""
        if self.replaying:
            return
        now = self._clock()
        for t in self.state.due(now):
            await self._fire(t, self.next_offset, "timer", False, None)
        self._observe(None)

    def _observe(self, received_at: float | None) -> None:
        m = self._metrics
        if received_at is not None:
            m.processing_seconds.observe(time.monotonic() - received_at)

    def _apply_transitions(self, upto: int) -> None:
        while self._transitions and self._transitions[0].position <= upto:
            t = self._transitions.popleft()
            if t.kind == "turn_closed":
                self.state.replay_close(t.conversation_id, t.turn)
            elif t.kind == "conversation_ended":
                self.state.replay_end(t.conversation_id)

    # -- effects -----------------------------------------------------------------------------

    async def _fire(
        self, t: Trigger, position: int, trigger: str, replay: bool, received_at: float | None
    ) -> None:
        kind = t.kind
        if t.kind == "conversation_ended" and t.end_reason is not None:
            self._metrics.conversations_ended.labels(t.end_reason).inc()
        if replay or t.key in self._keys:
            self._metrics.hooks_suppressed.labels(kind).inc()
            return
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
        )
        hook: Callable[[TurnContext], Awaitable[Outcome]] = getattr(self._hooks, f"on_{kind}")
        self._metrics.hooks_fired.labels(kind).inc()
        if received_at is not None:
            self._metrics.hook_dispatch_seconds.labels(kind).observe(time.monotonic() - received_at)
        await self._track(lambda: self._record_outcome(hook, ctx, position, trigger), position, conv)

    async def _track(
        self, start: Callable[[], Awaitable[None]], position: int, conv: Conversation | None
    ) -> None:
        """Run ``start()`` as a pending effect pinning ``position`` until it completes.

        The awaitable is created inside the task, so an effect cancelled before it ever ran
        leaves nothing un-awaited behind.
        """
        while len(self._pending) >= self._max_pending:
            live = {p.task for p in self._pending.values() if p.task is not None and not p.task.done()}
            if not live:
                break
            await asyncio.wait(live, return_when=asyncio.FIRST_COMPLETED)
        pid = next(self._ids)
        first = conv.first_offset if conv is not None else position
        jstart = conv.journal_start if conv is not None else self._journal_end
        entry = _Pending(position, first, jstart)
        self._pending[pid] = entry
        entry.task = asyncio.ensure_future(self._settle(pid, start))

    async def _settle(self, pid: int, start: Callable[[], Awaitable[None]]) -> None:
        await start()
        # Only a completed effect releases its pin; a cancelled or crashed one keeps the commit
        # point below its record so that the effect fires again after a restart.
        self._pending.pop(pid, None)

    async def _record_outcome(
        self, hook: Callable[[TurnContext], Awaitable[Outcome]], ctx: TurnContext, position: int, trigger: str
    ) -> None:
        try:
            outcome: Mapping[str, Any] = await hook(ctx)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._metrics.hook_errors.labels(ctx.kind).inc()
            log.warning("hook.failed", kind=ctx.kind, conversation_id=ctx.conversation_id, turn=ctx.turn,
                        error=type(exc).__name__)
            outcome = {"error": type(exc).__name__}
        record = {
            "v": RESULT_VERSION,
            "partition": self.partition,
            "position": position,
            "trigger": trigger,
            "kind": ctx.kind,
            "conversation_id": ctx.conversation_id,
            "turn": ctx.turn,
            "close_reason": ctx.close_reason,
            "end_reason": ctx.end_reason,
            "agent": ctx.agent,
            "tenant": ctx.tenant,
            "messages": len(ctx.messages),
            "outcome": dict(outcome),
        }
        offset = await self._results.append(self.partition, ctx.conversation_id, record)
        self._journal_end = max(self._journal_end, offset + 1)

    async def _dead_letter(self, record: SourceRecord, reason: str, detail: str) -> None:
        self._metrics.dead_lettered.labels(reason).inc()
        log.info("event.dead_lettered", partition=self.partition, offset=record.offset, reason=reason,
                 detail=detail)
        await self._track(lambda: self._dlq.dead_letter(record, reason, detail), record.offset, None)

    # -- commits and shutdown ----------------------------------------------------------------

    def commit_point(self) -> CommitPoint | None:
        """Where this partition may commit now, or None while replaying."""
        if self.replaying:
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
        return CommitPoint(offset=min(low, p), processed_until=p, journal_from=j)

    async def drain(self, timeout_seconds: float) -> bool:
        """Wait up to ``timeout_seconds`` for pending effects; True if none is left."""
        tasks = {e.task for e in self._pending.values() if e.task is not None and not e.task.done()}
        if tasks:
            await asyncio.wait(tasks, timeout=timeout_seconds)
        return not self._pending

    async def abandon(self) -> None:
        """Cancel pending effects (they stay pinned, so they fire again after the next owner rebuilds)."""
        tasks = [e.task for e in self._pending.values() if e.task is not None and not e.task.done()]
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    def gauges(self) -> tuple[int, int]:
        """(open conversations, text bytes) for the source's aggregate gauges."""
        return len(self.state), self.state.text_bytes

