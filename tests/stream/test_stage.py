"""The post-score stage: sinks see every effect before the results topic records it, the commit
point stays below an effect until its sinks accepted it, a crash before the journal write shows
the effect to the sinks again (at-least-once, same key), and a broken sink does not pin anything."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

from prometheus_client import CollectorRegistry

from sidecar.contract import Effect, GoalAssigned, HookResult, Scored, TurnContext
from sidecar.source.processor import PartitionProcessor
from sidecar.stage.pipeline import PostScoreStage
from sidecar.state.config import StateConfig
from sidecar.state.hooks import CompositeHooks, RecordingHooks
from sidecar.telemetry.stream_metrics import StreamMetrics
from tests.stream.fakes import FakeJournal, event, record


class TypedHooks(RecordingHooks):
    def on_conversation_ended(self, ctx: TurnContext) -> HookResult:
        return Scored({"goal": "g1"}, [GoalAssigned("g1")])


class GatedSink:
    name = "gated"

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.seen: list[tuple[str, int, str]] = []

    def offer(self, effect: Effect) -> Any:
        self.seen.append(effect.ctx.key)

        async def wait() -> None:
            await self.gate.wait()

        return wait() if effect.ctx.kind == "conversation_ended" else None


class BrokenSink:
    name = "broken"

    def offer(self, effect: Effect) -> Any:
        raise RuntimeError("bug")


def make(journal: FakeJournal, stage: PostScoreStage, hooks: Any, commit: Any = None) -> PartitionProcessor:
    return PartitionProcessor(
        partition=0,
        state_config=StateConfig(),
        hooks=hooks,
        results=journal,
        dead_letters=journal,
        metrics=StreamMetrics(CollectorRegistry()),
        recovery=journal.recovery(commit),
        max_record_bytes=10_000,
        max_pending=8,
        stage=stage,
    )


async def test_journal_waits_for_sinks_and_commit_stays_pinned() -> None:
    j = FakeJournal()
    sink = GatedSink()
    p = make(j, PostScoreStage([sink]), TypedHooks())
    await p.process(record(0, event("c", 0, "user")), 0.0)
    await p.process(record(1, event("c", 1, None, end=True)), 0.0)
    await asyncio.sleep(0.01)
    assert [r["kind"] for r in j.results] == ["user_message", "turn_closed"]  # the end waits for the sink
    cp = p.commit_point()
    assert cp is not None and cp.processed_until == 1
    sink.gate.set()
    assert await p.drain(5)
    assert [r["kind"] for r in j.results] == ["user_message", "turn_closed", "conversation_ended"]
    assert j.results[-1]["outcome"] == {"goal": "g1"}
    cp = p.commit_point()
    assert cp is not None and cp.processed_until == 2


async def test_crash_before_acceptance_shows_the_effect_again_and_journals_it_once() -> None:
    j = FakeJournal()
    sink = GatedSink()
    p = make(j, PostScoreStage([sink]), TypedHooks())
    recs = [record(0, event("c", 0, "user")), record(1, event("c", 1, None, end=True))]
    for r in recs:
        await p.process(r, 0.0)
    cp = await p.release(0.01, 1)  # a graceful stop while the sink still waits
    p2 = make(j, PostScoreStage([sink]), TypedHooks(), cp)
    sink.gate.set()
    for r in recs[cp.offset if cp else 0 :]:
        await p2.process(r, 0.0)
    assert await p2.drain(5)
    assert Counter(sink.seen)[("c", 1, "conversation_ended")] == 2  # at-least-once to sinks
    kinds = Counter(r["kind"] for r in j.results)
    assert kinds == Counter({"user_message": 1, "turn_closed": 1, "conversation_ended": 1})  # once in the journal


async def test_a_broken_sink_is_counted_and_does_not_pin() -> None:
    j = FakeJournal()
    errors: list[str] = []
    p = make(j, PostScoreStage([BrokenSink()], on_sink_error=errors.append), RecordingHooks())
    await p.process(record(0, event("c", 0, "user")), 0.0)
    assert await p.drain(5)
    assert errors == ["broken"] and len(j.results) == 1


async def test_composite_hooks_merge_typed_events_of_members() -> None:
    class Late(RecordingHooks):
        async def _end(self) -> Any:
            await asyncio.sleep(0)
            return Scored({"x": 1}, [GoalAssigned("late")])

        def on_conversation_ended(self, ctx: TurnContext) -> HookResult:
            return self._end()

    hooks = CompositeHooks({"a": TypedHooks(), "b": Late(), "c": RecordingHooks()})
    ctx = TurnContext("conversation_ended", "c", 1, (), None, None)
    out = hooks.on_conversation_ended(ctx)
    assert not isinstance(out, dict)
    merged = await out  # type: ignore[misc]
    assert isinstance(merged, Scored)
    assert [e.goal for e in merged.events] == ["g1", "late"]  # type: ignore[union-attr]
    assert merged["a"] == {"goal": "g1"} and merged["b"] == {"x": 1}
