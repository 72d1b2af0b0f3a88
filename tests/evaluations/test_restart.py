"""Exactly-once pinning of the results-out sinks through the real processor (fake scorers, no vLLM):
while the receiver fails, effects stay pinned below the commit point; a stop abandons them; the
next owner re-fires them and re-sends their records with the same ids. The receiver then holds
every verdict, parented to the right span, and nothing twice beyond identical copies of one id."""

from __future__ import annotations

import asyncio
from collections import Counter, defaultdict
from typing import Any

from prometheus_client import CollectorRegistry

from sidecar.alerting.config import RetryConfig
from sidecar.contract import GoalAssigned, HookResult, Scored, TurnContext
from sidecar.evaluations.config import DeliveryConfig, OtlpEvaluationsConfig
from sidecar.evaluations.metrics import EvaluationMetrics
from sidecar.evaluations.otlp import OtlpEvaluationsSink
from sidecar.evaluations.results import record_id
from sidecar.source.journal import CommitPoint
from sidecar.source.processor import PartitionProcessor
from sidecar.stage.pipeline import PostScoreStage
from sidecar.state.config import StateConfig
from sidecar.state.hooks import RecordingHooks
from sidecar.telemetry.stream_metrics import StreamMetrics
from tests.evaluations.effects import completion, tree
from tests.evaluations.receivers import OtlpReceiver
from tests.stream.fakes import FakeJournal, event, record

TRACE = "0af7651916cd43dd8448eb211c80319c"
SPANS = ["b7ad6b7169203331", "c7ad6b7169203332", "d7ad6b7169203333", "e7ad6b7169203334"]


class Verdicts(RecordingHooks):
    """What the scorers would return, as typed events."""

    def on_user_message(self, ctx: TurnContext) -> HookResult:
        return Scored({"tree": 1}, [tree()])

    def on_turn_closed(self, ctx: TurnContext) -> HookResult:
        return Scored({"completion": 1}, [completion()])

    def on_conversation_ended(self, ctx: TurnContext) -> HookResult:
        return Scored({"final": 1}, [completion(0.9, final=True), GoalAssigned("g1")])


def traced(ev: dict[str, Any], span: str) -> dict[str, Any]:
    return {**ev, "trace_id": TRACE, "span_id": span}


def records() -> list[Any]:
    evs = [
        traced(event("c", 0, "user"), SPANS[0]),
        event("d", 0, "user"),
        traced(event("c", 1, "assistant"), SPANS[1]),
        event("d", 1, "assistant"),
        traced(event("c", 2, "user"), SPANS[2]),
        traced(event("c", 3, "assistant"), SPANS[3]),
        event("c", 4, None, end=True),
        event("d", 2, None, end=True),
    ]
    return [record(i, e) for i, e in enumerate(evs)]


def processor(journal: FakeJournal, sink: OtlpEvaluationsSink, commit: CommitPoint | None) -> PartitionProcessor:
    return PartitionProcessor(
        partition=0,
        state_config=StateConfig(),
        hooks=Verdicts(),
        results=journal,
        dead_letters=journal,
        metrics=StreamMetrics(CollectorRegistry()),
        recovery=journal.recovery(commit),
        max_record_bytes=10_000,
        max_pending=64,
        stage=PostScoreStage([sink]),
    )


def sink_for(receiver: OtlpReceiver) -> OtlpEvaluationsSink:
    retry = RetryConfig(initial_backoff_seconds=0.01, max_backoff_seconds=0.05)
    cfg = OtlpEvaluationsConfig(
        enabled=True,
        endpoint=receiver.endpoint,
        delivery=DeliveryConfig(flush_seconds=0.01, max_batch_records=1, timeout_seconds=1.0, retry=retry),
    )
    return OtlpEvaluationsSink(cfg, EvaluationMetrics(CollectorRegistry()), include_text=False)


async def test_restart_resends_with_the_same_ids_and_nothing_is_lost() -> None:
    receiver = OtlpReceiver()
    await receiver.start()
    journal = FakeJournal()
    recs = records()
    try:
        # First owner: the receiver takes six records (one per request), then fails until the owner
        # is gone. The sixth is the first of the two records of c's final effect: that effect is
        # accepted in part, so it is not journaled and its accepted record goes out again.
        receiver.plan.extend([200] * 6 + [503] * 100_000)
        sink = sink_for(receiver)
        await sink.start()
        p = processor(journal, sink, None)
        for r in recs:
            await p.process(r, 0.0)
        await asyncio.sleep(0.3)
        pinned = p.commit_point()
        assert pinned is not None and pinned.offset == 0  # effects are owed: nothing may be committed
        cp = await p.release(0.05, 1)
        await sink.stop()
        first_journal = len(journal.results)
        assert len(receiver.records()) == 6 and first_journal < 8

        # Next owner: the receiver is back.
        receiver.plan.clear()
        sink = sink_for(receiver)
        await sink.start()
        p = processor(journal, sink, cp)
        for r in recs[cp.offset if cp else 0 :]:
            await p.process(r, 0.0)
        assert await p.drain(10)
        await sink.stop()
    finally:
        await receiver.stop()

    kinds = Counter((r["conversation_id"], r["turn"], r["kind"]) for r in journal.results)
    assert all(n == 1 for n in kinds.values()) and len(kinds) == 8  # c: 2 turns + end; d: 1 turn + end

    expected = {
        record_id("c", 1, "user_message", "response_uncertainty"): SPANS[0],
        record_id("c", 1, "turn_closed", "goal_completion"): SPANS[1],
        record_id("c", 2, "user_message", "response_uncertainty"): SPANS[2],
        record_id("c", 2, "turn_closed", "goal_completion"): SPANS[3],
        record_id("c", 2, "conversation_ended", "goal_completion"): SPANS[3],
        record_id("c", 2, "conversation_ended", "user_goal"): SPANS[3],
        record_id("d", 1, "user_message", "response_uncertainty"): "",
        record_id("d", 1, "turn_closed", "goal_completion"): "",
        record_id("d", 1, "conversation_ended", "goal_completion"): "",
        record_id("d", 1, "conversation_ended", "user_goal"): "",
    }
    copies: dict[str, list[Any]] = defaultdict(list)
    for got in receiver.records():
        copies[got.uid].append(got)
    assert set(copies) == set(expected)  # every verdict, nothing else
    for uid, same in copies.items():
        assert {s.span_id for s in same} == {expected[uid]}
        assert {s.trace_id for s in same} == {TRACE if expected[uid] else ""}
        assert all(s.content() == same[0].content() for s in same)  # a re-send is an identical copy
    assert sum(len(v) for v in copies.values()) > len(copies)  # the restart did re-send something
