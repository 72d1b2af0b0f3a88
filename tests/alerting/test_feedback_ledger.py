"""The feedback ledger without Kafka: rows decoded strictly (the topic is untrusted), counted into
the thresholds by key (a row written again counts once, a replaced or deleted row comes out, other
epochs never count), and the processor holding the commit below a feedback record until its row is
written, again after a restart when the journal shows the feedback but the row may be missing."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from sidecar.alerting.alert import alert_id
from sidecar.alerting.config import AlertingConfig
from sidecar.alerting.feedback import AlertFeedback, FeedbackMetrics
from sidecar.alerting.ledger import (
    MAX_ROW_BYTES,
    FeedbackLedger,
    Judgement,
    decode_judgement,
    encode_judgement,
)
from sidecar.alerting.thresholds import FeedbackThresholds, ThresholdMetrics
from sidecar.fleet.table import Change, InvalidRow
from sidecar.source.config import KafkaConfig
from sidecar.source.processor import PartitionProcessor
from sidecar.stage.feedback import joined
from sidecar.stage.pipeline import PostScoreStage
from sidecar.state.config import StateConfig
from sidecar.state.hooks import RecordingHooks
from sidecar.telemetry.labels import AgentLabels
from sidecar.telemetry.stream_metrics import StreamMetrics
from tests.stream.fakes import FakeJournal, Rec, event, record

ON: dict[str, Any] = {"adapt_thresholds": True, "min_judged_alerts": 10, "min_rate_scale": 0.5}


def ledger(epoch: int = 0) -> FeedbackLedger:
    alerting = AlertingConfig.model_validate({"feedback": {**ON, "epoch": epoch}})
    thresholds = FeedbackThresholds(alerting.feedback, ThresholdMetrics(CollectorRegistry()))
    return FeedbackLedger(alerting, KafkaConfig(), thresholds, AgentLabels(), CollectorRegistry())


def row(verdict: str = "false_alarm", **over: Any) -> bytes:
    doc = {"v": 1, "agent": "shop", "kind": "uncertain_turn", "verdict": verdict, "epoch": 0, **over}
    return json.dumps(doc).encode()


def test_a_row_round_trips() -> None:
    j = Judgement("shop", "uncertain_turn", True, 3)
    assert decode_judgement(encode_judgement(j)) == j
    assert decode_judgement(row(agent=None)).agent is None


@pytest.mark.parametrize(
    "value",
    [
        b"",
        b"not json",
        b"[" * 10_000,
        b"[]",
        b"null",
        json.dumps({"agent": "shop"}).encode(),
        row(v=2),
        row(verdict="up"),
        row(kind="conversation_stalled"),  # a kind that never moves
        row(kind=["uncertain_turn"]),
        row(agent=7),
        row(agent="a" * 257),
        row(epoch=-1),
        row(epoch=True),
        row(epoch=2**31),
        row(epoch="0"),
        b" " * (MAX_ROW_BYTES + 1),
    ],
)
def test_hostile_rows_are_refused(value: bytes) -> None:
    with pytest.raises(InvalidRow):
        decode_judgement(value)


def test_rows_count_once_by_key_and_only_in_their_epoch() -> None:
    led = ledger(epoch=1)
    t = led.thresholds
    for i in range(10):
        led._changed(Change(f"f{i}", decode_judgement(row(epoch=1))))
    assert t.tally("shop", "uncertain_turn") == (0, 10) and t.scale("shop", "uncertain_turn") == pytest.approx(0.8)
    for i in range(10):  # the same judgements written again (a replay, a new owner): nothing changes
        led._changed(Change(f"f{i}", decode_judgement(row(epoch=1))))
    assert t.tally("shop", "uncertain_turn") == (0, 10)
    led._changed(Change("f0", decode_judgement(row("true_alarm", epoch=1))))  # a row replaced
    assert t.tally("shop", "uncertain_turn") == (1, 9)
    led._changed(Change("f1", None))  # a tombstone
    assert t.tally("shop", "uncertain_turn") == (1, 8) and t.scale("shop", "uncertain_turn") == 1.0
    for i in range(50):  # rows of another epoch: before a reset, never counted
        led._changed(Change(f"old{i}", decode_judgement(row(epoch=0))))
    assert t.tally("shop", "uncertain_turn") == (1, 8)
    led._changed(Change("f2", decode_judgement(row(epoch=0))))  # a counted row rewritten under another epoch
    assert t.tally("shop", "uncertain_turn") == (1, 7)


async def test_joined_waits_for_both_and_a_failure_keeps_the_pin() -> None:
    loop = asyncio.get_running_loop()
    acked, recorded = loop.create_future(), loop.create_future()
    both = joined(acked, recorded)
    acked.set_result(7)
    await asyncio.sleep(0)
    assert not both.done()
    recorded.set_result(None)
    assert await both == 7
    a2, r2 = loop.create_future(), loop.create_future()
    failed = joined(a2, r2)
    r2.cancel()
    a2.set_result(1)
    await asyncio.sleep(0)
    assert failed.cancelled()
    a3: asyncio.Future[int] = loop.create_future()
    assert joined(a3, None) is a3


class FakeLedger:
    """Records what the sink asks to write; the test decides when each write is acknowledged."""

    def __init__(self) -> None:
        self.writes: list[tuple[str, bool, asyncio.Future[None]]] = []

    def record(
        self, event_id: str, agent: str | None, kind: str, *, true_alarm: bool, again: bool
    ) -> asyncio.Future[None]:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.writes.append((event_id, again, fut))
        return fut


def _feedback(offset: int, eid: str, rating: str) -> Rec:
    body = {"target": "alert", "rating": rating, "turn": 1, "alert_id": alert_id("g", "c", 1, "uncertain_turn")}
    ev = {"conversation_id": "c", "event_id": eid, "ts": 1.0, "type": "feedback", "feedback": body}
    return Rec("t", 0, offset, b"c", json.dumps(ev).encode())


def _processor(j: FakeJournal, fake: FakeLedger, commit: Any) -> PartitionProcessor:
    sink = AlertFeedback("g", FeedbackMetrics(CollectorRegistry()), AgentLabels(), ledger=fake)  # type: ignore[arg-type]
    return PartitionProcessor(
        partition=0,
        state_config=StateConfig(),
        hooks=RecordingHooks(),
        results=j,
        dead_letters=j,
        metrics=StreamMetrics(CollectorRegistry()),
        recovery=j.recovery(commit),
        max_record_bytes=10_000,
        max_pending=8,
        stage=PostScoreStage(feedback=sink),
    )


async def test_the_commit_waits_for_the_row_and_a_restart_writes_a_missing_one_again() -> None:
    j, fake = FakeJournal(), FakeLedger()
    first = _processor(j, fake, None)
    await first.process(record(0, event("c", 0, "user", agent=None)), 0.0)
    assert await first.drain(5)
    commit = first.commit_point()
    assert commit is not None and commit.processed_until == 1
    await first.process(_feedback(1, "f1", "false_alarm"), 0.0)
    await first.process(_feedback(2, "f-up", "true_alarm"), 0.0)
    await asyncio.sleep(0)
    [(eid, again, fut), (eid2, _, _unacked)] = fake.writes
    assert (eid, again, eid2) == ("f1", False, "f-up")
    assert len([r for r in j.results if r["kind"] == "feedback"]) == 2  # journaled
    held = first.commit_point()
    assert held is not None and held.processed_until == 1  # the journal has both, the ledger neither yet
    fut.set_result(None)
    await asyncio.sleep(0.05)
    held = first.commit_point()
    assert held is not None and held.processed_until == 2  # f1's row written; f-up's not yet

    # The process dies here. The next owner starts from the commit before f1: the journal shows
    # both applied, so neither is applied again, but each row is asked for again (written only if
    # the table lacks it), and the commit waits for that too.
    again_fake = FakeLedger()
    second = _processor(j, again_fake, commit)
    for r in (
        record(0, event("c", 0, "user", agent=None)),
        _feedback(1, "f1", "false_alarm"),
        _feedback(2, "f-up", "true_alarm"),
    ):
        await second.process(r, 0.0)
    await asyncio.sleep(0.05)
    assert [(e, a) for e, a, _ in again_fake.writes] == [("f1", True), ("f-up", True)]
    assert len([r for r in j.results if r["kind"] == "feedback"]) == 2  # nothing journaled twice
    held = second.commit_point()
    assert held is not None and held.processed_until == 1
    for _, _, f in again_fake.writes:
        f.set_result(None)
    assert await second.drain(5)
    done = second.commit_point()
    assert done is not None and done.processed_until == 3


async def test_feedback_that_moves_nothing_writes_no_row() -> None:
    j, fake = FakeJournal(), FakeLedger()
    p = _processor(j, fake, None)
    await p.process(record(0, event("c", 0, "user", agent=None)), 0.0)
    ev = {
        "conversation_id": "c",
        "event_id": "f",
        "ts": 1.0,
        "type": "feedback",
        "feedback": {"target": "conversation", "rating": "down"},
    }
    await p.process(Rec("t", 0, 1, b"c", json.dumps(ev).encode()), 0.0)
    stalled = {
        "target": "alert",
        "rating": "false_alarm",
        "turn": 1,
        "alert_id": alert_id("g", "c", 1, "conversation_stalled"),
    }
    ev2 = {"conversation_id": "c", "event_id": "f2", "ts": 1.0, "type": "feedback", "feedback": stalled}
    await p.process(Rec("t", 0, 2, b"c", json.dumps(ev2).encode()), 0.0)
    assert fake.writes == []
    assert await p.drain(5)
    point = p.commit_point()
    assert point is not None and point.processed_until == 3


def test_rows_read_back_at_start_move_quietly_then_one_line_says_where_each_stands() -> None:
    from structlog.testing import capture_logs

    led = ledger()
    t = led.thresholds
    assert not led.table.caught_up
    with capture_logs() as logs:
        for i in range(40):
            led._changed(Change(f"f{i}", decode_judgement(row())))
        t.restored()
    assert t.scale("shop", "uncertain_turn") == 0.5  # four steps, at the floor
    assert [e["event"] for e in logs] == ["alerting.threshold_restored"]
    assert (logs[0]["scale"], logs[0]["true_alarms"], logs[0]["false_alarms"]) == (0.5, 0, 40)
    assert t.metrics.moves.labels("shop", "uncertain_turn", "stricter")._value.get() == 0
