"""Feedback through the processor: accepted on open and finished conversations without taking a
seq, dead-lettered with a clear reason when duplicate or unknown, counted per agent and kind, and
journaled so that a restart applies it never twice."""

from __future__ import annotations

import asyncio
import json
import random
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from sidecar.alerting.alert import alert_id
from sidecar.alerting.feedback import AlertFeedback, FeedbackMetrics
from sidecar.contract import Outcome
from sidecar.source.journal import CommitPoint, Recovery
from sidecar.source.processor import PartitionProcessor
from sidecar.stage.feedback import FeedbackContext
from sidecar.stage.pipeline import PostScoreStage
from sidecar.state.config import StateConfig
from sidecar.state.hooks import RecordingHooks
from sidecar.telemetry.labels import AgentLabels
from sidecar.telemetry.stream_metrics import StreamMetrics
from tests.stream.fakes import FakeJournal, Rec, event, record
from tests.stream.test_processor import conversation_records

GROUP = "sidecar-g"


class CountingFeedback(AlertFeedback):
    """The real sink, also keeping every context it applied."""

    def __init__(self, registry: CollectorRegistry) -> None:
        super().__init__(GROUP, FeedbackMetrics(registry), AgentLabels(["a"]))
        self.applied: list[FeedbackContext] = []

    def apply(self, ctx: FeedbackContext) -> Outcome:
        self.applied.append(ctx)
        return super().apply(ctx)


def make(journal: FakeJournal, recovery: Recovery, sink: CountingFeedback) -> PartitionProcessor:
    return PartitionProcessor(
        partition=0,
        state_config=StateConfig(turn_debounce_seconds=5, idle_ttl_seconds=60),
        hooks=RecordingHooks(),
        results=journal,
        dead_letters=journal,
        metrics=StreamMetrics(CollectorRegistry()),
        recovery=recovery,
        max_record_bytes=10_000,
        max_pending=8,
        stage=PostScoreStage(feedback=sink),
    )


def feedback(offset: int, cid: str, eid: str, body: dict[str, Any], **over: Any) -> Rec:
    ev = {"conversation_id": cid, "event_id": eid, "ts": 1.0, "type": "feedback", "feedback": body, **over}
    return Rec("t", 0, offset, cid.encode(), json.dumps(ev).encode())


def conversation(start: int, cid: str, *, end: bool) -> list[Rec]:
    msgs = [("user", 0), ("assistant", 1), ("user", 2), ("assistant", 3)]
    recs = [record(start + i, event(cid, seq, role)) for i, (role, seq) in enumerate(msgs)]
    if end:
        recs.append(record(start + len(recs), event(cid, 4, None, end=True)))
    return recs


def fed(journal: FakeJournal) -> list[dict[str, Any]]:
    return [r for r in journal.results if r["kind"] == "feedback"]


def value(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, labels)


async def run(p: PartitionProcessor, recs: list[Rec]) -> None:
    for r in recs:
        await p.process(r, 0.0)
    assert await p.drain(5)


async def test_feedback_takes_no_seq_and_is_accepted_after_the_end() -> None:
    registry = CollectorRegistry()
    j, sink = FakeJournal(), CountingFeedback(registry)
    p = make(j, j.recovery(None), sink)
    recs = conversation(0, "open", end=False)[:2]
    recs.append(feedback(2, "open", "f1", {"target": "turn", "rating": "down", "turn": 1, "reason": "wrong table"}))
    recs += [record(3, event("open", 2, "user")), record(4, event("open", 3, "assistant"))]  # seq goes on: 2, 3
    recs += conversation(5, "done", end=True)
    recs.append(feedback(10, "done", "f2", {"target": "conversation", "rating": "up"}, agent="a"))
    await run(p, recs)
    assert j.dead == []
    assert p.state.conversations["open"].next_seq == 4  # feedback took no seq
    first, second = fed(j)
    assert (first["conversation_id"], first["turn"], first["position"], first["agent"]) == ("open", 1, 2, "a")
    assert first["outcome"] == {
        "event_id": "f1",
        "target": "turn",
        "rating": "down",
        "turn": 1,
        "alert_id": None,
        "alert_kind": None,
        "with_reason": True,
        "conversation_open": True,
    }
    assert "wrong table" not in json.dumps(j.results)  # a person's words stay out of the journal
    assert (second["conversation_id"], second["outcome"]["conversation_open"]) == ("done", False)
    assert value(registry, "sidecar_feedback_total", agent="a", target="turn", rating="down") == 1
    assert value(registry, "sidecar_feedback_total", agent="a", target="conversation", rating="up") == 1


async def test_duplicate_unknown_and_forged_feedback_is_dead_lettered_with_its_reason() -> None:
    registry = CollectorRegistry()
    j, sink = FakeJournal(), CountingFeedback(registry)
    p = make(j, j.recovery(None), sink)
    real = alert_id(GROUP, "c", 2, "uncertain_turn")
    other_group = alert_id("another-group", "c", 2, "uncertain_turn")
    recs = conversation(0, "c", end=False)  # two user turns
    recs += [
        feedback(4, "c", "f1", {"target": "alert", "rating": "false_alarm", "turn": 2, "alert_id": real}),
        feedback(5, "c", "f1", {"target": "alert", "rating": "false_alarm", "turn": 2, "alert_id": real}),
        feedback(6, "nobody", "f2", {"target": "conversation", "rating": "down"}),
        feedback(7, "c", "f3", {"target": "turn", "rating": "up", "turn": 3}),
        feedback(8, "c", "f4", {"target": "alert", "rating": "true_alarm", "turn": 2, "alert_id": other_group}),
        feedback(9, "c", "f5", {"target": "alert", "rating": "true_alarm", "turn": 1, "alert_id": real}),
        feedback(10, "c", "f6", {"target": "conversation", "rating": "meh"}),
        Rec("t", 0, 11, b"other-key", json.dumps({"conversation_id": "c", "event_id": "f7", "ts": 1,
            "type": "feedback", "feedback": {"target": "conversation", "rating": "up"}}).encode()),
        # An id is taken once, even by a feedback refused for its turn: a corrected copy needs a new id.
        feedback(12, "c", "f3", {"target": "turn", "rating": "up", "turn": 2}),
        feedback(13, "c", "f8", {"target": "turn", "rating": "up", "turn": 2}),
        # ...but not by one on an unknown conversation (nothing to remember it by).
        feedback(14, "nobody", "f2", {"target": "conversation", "rating": "down"}),
    ]  # fmt: skip
    await run(p, recs)
    assert j.dead == [
        (5, "duplicate_event"),
        (6, "unknown_conversation"),
        (7, "unknown_turn"),
        (8, "unknown_alert"),
        (9, "unknown_alert"),
        (10, "schema"),
        (11, "key_mismatch"),
        (12, "duplicate_event"),
        (14, "unknown_conversation"),
    ]
    assert [r["position"] for r in fed(j)] == [4, 13]
    assert fed(j)[0]["outcome"]["alert_kind"] == "uncertain_turn"
    assert value(registry, "sidecar_alert_feedback_total", agent="a", kind="uncertain_turn", verdict="false_alarm") == 1
    assert value(registry, "sidecar_alert_precision", agent="a", kind="uncertain_turn") == 0.0


async def test_alert_precision_counts_true_and_false_alarms_per_kind() -> None:
    registry = CollectorRegistry()
    j, sink = FakeJournal(), CountingFeedback(registry)
    p = make(j, j.recovery(None), sink)
    recs = conversation(0, "c", end=True)
    ratings = ["true_alarm", "true_alarm", "false_alarm", "true_alarm"]
    stalled = alert_id(GROUP, "c", 2, "conversation_stalled")
    for i, rating in enumerate(ratings):
        body = {"target": "alert", "rating": rating, "turn": 2, "alert_id": stalled}
        recs.append(feedback(5 + i, "c", f"f{i}", body, agent="a"))
    await run(p, recs)
    labels = {"agent": "a", "kind": "conversation_stalled"}
    assert value(registry, "sidecar_alert_feedback_total", **labels, verdict="true_alarm") == 3
    assert value(registry, "sidecar_alert_feedback_total", **labels, verdict="false_alarm") == 1
    assert value(registry, "sidecar_alert_precision", **labels) == 0.75
    assert sink.judged("a", "conversation_stalled") == (3, 1)


async def test_a_restart_applies_journaled_feedback_never_twice() -> None:
    """The commit is taken before the feedback; the process dies after its outcome was journaled.
    The next owner replays the records above the commit: the feedback is not applied again, and a
    copy of it sent after the restart is still a duplicate."""
    j = FakeJournal()
    first = CountingFeedback(CollectorRegistry())
    p = make(j, j.recovery(None), first)
    recs = conversation(0, "c", end=False)
    await run(p, recs[:2])
    commit = p.commit_point()
    assert isinstance(commit, CommitPoint) and commit.offset == 0  # the open conversation pins it
    recs.insert(2, feedback(2, "c", "f1", {"target": "conversation", "rating": "down"}))
    for i in range(2, len(recs)):
        recs[i] = Rec(recs[i].topic, 0, i, recs[i].key, recs[i].value)
    await run(p, recs[2:])
    assert len(first.applied) == 1 and len(fed(j)) == 1
    # kill -9: the commit stays where it was; the next owner rebuilds from it and the journal.
    second = CountingFeedback(CollectorRegistry())
    p2 = make(j, j.recovery(commit), second)
    again = feedback(len(recs), "c", "f1", {"target": "conversation", "rating": "down"})
    await run(p2, [*recs, again])
    assert second.applied == [] and len(fed(j)) == 1
    assert j.dead == [(len(recs), "duplicate_event")]
    # Past the commit the replay is silent: the same holds when the commit covers the feedback.
    late = p2.commit_point()
    assert late is not None
    third = CountingFeedback(CollectorRegistry())
    p3 = make(j, j.recovery(late), third)
    await run(p3, [*recs, again])
    assert third.applied == [] and len(fed(j)) == 1


async def test_without_a_feedback_sink_alert_feedback_is_unknown() -> None:
    j = FakeJournal()
    p = PartitionProcessor(
        partition=0,
        state_config=StateConfig(),
        hooks=RecordingHooks(),
        results=j,
        dead_letters=j,
        metrics=StreamMetrics(CollectorRegistry()),
        recovery=j.recovery(None),
        max_record_bytes=10_000,
        max_pending=8,
    )
    real = alert_id(GROUP, "c", 1, "uncertain_turn")
    alert = {"target": "alert", "rating": "true_alarm", "turn": 1, "alert_id": real}
    turn = {"target": "turn", "rating": "up", "turn": 1}
    await run(p, [record(0, event("c", 0, "user")), feedback(1, "c", "f", alert), feedback(2, "c", "g", turn)])
    assert j.dead == [(1, "unknown_alert")]
    assert len(fed(j)) == 1


def with_feedback(recs: list[Rec], seed: int) -> tuple[list[Rec], set[str]]:
    """``recs`` with feedback interleaved: on a turn right after a user message, on whole
    conversations after their end, and re-sent copies of some; the ids that must be journaled."""
    rng = random.Random(seed)
    out: list[Rec] = []
    expected: set[str] = set()
    sent: list[tuple[str, dict[str, Any]]] = []
    for r in recs:
        out.append(r)
        ev = json.loads(r.value or b"{}")
        cid = ev["conversation_id"]
        if ev["type"] == "message" and ev["message"]["role"] == "user" and rng.random() < 0.3:
            sent.append((f"{cid}-t{ev['seq']}", {"target": "turn", "rating": "down", "turn": 1}))
        elif ev["type"] == "conversation_end" and rng.random() < 0.5:
            sent.append((f"{cid}-end", {"target": "conversation", "rating": "up"}))
        else:
            continue
        eid, body = sent[-1]
        out.append(feedback(len(out), cid, eid, body))
        expected.add(eid)
        if rng.random() < 0.3:  # a producer's retry: the same feedback again, later
            eid, body = rng.choice(sent)
            out.append(feedback(len(out), eid.rsplit("-", 1)[0], eid, body))
    return [Rec(r.topic, 0, i, r.key, r.value) for i, r in enumerate(out)], expected


def scan_finished(recs: list[Rec], commit: CommitPoint | None) -> tuple[list[tuple[str, int]], list[str]]:
    """What recovery's scan of the source from F to L finds (the fake journal has no source topic)."""
    if commit is None or commit.finished_from is None:
        return [], []
    finished: list[tuple[str, int]] = []
    ids: list[str] = []
    for r in recs[commit.finished_from : commit.offset]:
        ev = json.loads(r.value or b"{}")
        if ev["type"] == "message" and ev["seq"] == 0:
            finished.append((ev["conversation_id"], r.offset))
        elif ev["type"] == "feedback" and ev["conversation_id"] in {c for c, _ in finished}:
            ids.append(ev["event_id"])
    return finished, ids


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), crash_points=st.lists(st.integers(0, 160), max_size=6))
async def test_crash_anywhere_applies_each_feedback_exactly_once(seed: int, crash_points: list[int]) -> None:
    base, _ = conversation_records(12, seed)
    recs, expected = with_feedback(base, seed)
    j = FakeJournal()
    commit: CommitPoint | None = None

    def restart() -> PartitionProcessor:
        plan = j.recovery(commit)
        plan.finished, plan.feedback_ids = scan_finished(recs, commit)
        return make(j, plan, CountingFeedback(CollectorRegistry()))

    p = restart()
    i = 0
    crashes = sorted(set(crash_points))
    while i < len(recs):
        if crashes and i >= crashes[0]:
            crashes.pop(0)
            await p.abandon()  # whatever was in flight is lost
            p = restart()
            i = commit.offset if commit else 0
            continue
        await p.process(recs[i], 0.0)
        if i % 3 == 0:
            await asyncio.sleep(0)
            commit = p.commit_point() or commit
        i += 1
    assert await p.drain(5)
    journaled = [r["outcome"]["event_id"] for r in fed(j)]
    assert sorted(journaled) == sorted(expected)  # every feedback once, none twice, copies never


def test_feedback_ids_are_bounded_and_counted_in_the_partitions_memory() -> None:
    from sidecar.events import decode_event
    from sidecar.state.feedback import FeedbackMemory
    from sidecar.state.memory import FEEDBACK_ENTRY_BYTES, MemoryBudget
    from sidecar.state.store import PartitionState

    budget = MemoryBudget(1 << 30)
    state = PartitionState(StateConfig(finished_memory=3), budget)
    memory = FeedbackMemory(3, state.hold)
    state.apply(decode_event(record(0, event("c", 0, "user")).value, b"c", max_bytes=10_000), 0, 0.0, 0)
    before = state.mem_bytes
    for i in range(10):
        raw = feedback(1 + i, "c", f"f{i}", {"target": "conversation", "rating": "up"}).value
        memory.take(state, decode_event(raw, b"c", max_bytes=10_000))
    assert len(memory) == 3
    assert state.mem_bytes - before == 3 * FEEDBACK_ENTRY_BYTES
    state.close()
    assert state.mem_bytes == 0
