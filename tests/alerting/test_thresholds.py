"""Thresholds moved by people's feedback: off by default, within the configured bounds, each move
logged and shown on /readyz, reversible, the same for the same feedback, and felt by the
uncertain-turn rule; end to end, from feedback events through the processor."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from structlog.testing import capture_logs

from sidecar.alerting.alert import alert_id
from sidecar.alerting.config import AlertingConfig, FeedbackThresholdsConfig, UncertaintyPolicyConfig
from sidecar.alerting.escalation import Escalations
from sidecar.alerting.feedback import AlertFeedback, FeedbackMetrics
from sidecar.alerting.metrics import AlertMetrics
from sidecar.alerting.thresholds import FeedbackThresholds, ThresholdMetrics, scale_for
from sidecar.contract import Effect, TreeScored, TurnContext
from sidecar.source.processor import PartitionProcessor
from sidecar.stage.pipeline import PostScoreStage
from sidecar.state.config import StateConfig
from sidecar.state.hooks import RecordingHooks
from sidecar.telemetry.labels import AgentLabels
from sidecar.telemetry.stream_metrics import StreamMetrics
from sidecar.transcript.model import Message
from tests.stream.fakes import FakeJournal, Rec, event, record

ON: dict[str, Any] = {
    "adapt_thresholds": True,
    "min_judged_alerts": 10,
    "target_precision": 0.5,
    "step": 0.2,
    "min_rate_scale": 0.5,
}


def make(registry: CollectorRegistry | None = None, **over: Any) -> FeedbackThresholds:
    return FeedbackThresholds(FeedbackThresholdsConfig(**over), ThresholdMetrics(registry or CollectorRegistry()))


def judge(t: FeedbackThresholds, verdicts: str, agent: str = "shop") -> None:
    """``verdicts``: one letter per judged alert, T (true alarm) or F (false alarm)."""
    for v in verdicts:
        t.judged(agent, "uncertain_turn", true_alarm=v == "T", configured_rate=0.05)


def test_off_by_default_and_configured_thresholds_stay() -> None:
    t = make()
    judge(t, "F" * 200)
    rule = UncertaintyPolicyConfig()
    assert t.scale("shop", "uncertain_turn") == 1.0
    assert t.uncertainty("shop", rule) is rule
    assert t.health().detail == "off: configured thresholds"


@pytest.mark.parametrize(
    ("true", "false", "scale"),
    [
        (0, 9, 1.0),  # nine judged: below min_judged_alerts, nothing moves
        (3, 7, 0.8),  # precision 0.3: 2 true alarms short of 0.5, one step (5 per step)
        (5, 5, 1.0),  # at the target precision: as configured
        (4, 6, 0.8),  # 1 short: still one step
        (0, 20, 0.64),  # 10 short: two steps
        (0, 40, 0.5),  # 20 short: four steps, 0.41 -> the 0.5 floor
        (30, 40, 0.8),  # 5 short: one step
        (40, 40, 1.0),  # enough true alarms: back to configured, never above
    ],
)
def test_the_scale_is_a_function_of_the_tally(true: int, false: int, scale: float) -> None:
    assert scale_for(true, false, FeedbackThresholdsConfig(**ON)) == pytest.approx(scale)


def test_false_alarms_make_the_rule_stricter_and_the_move_is_logged() -> None:
    registry = CollectorRegistry()
    t = make(registry, **ON)
    with capture_logs() as logs:
        judge(t, "TTTFFFFFF")  # nine judged: nothing yet
        assert t.scale("shop", "uncertain_turn") == 1.0
        judge(t, "F")  # the tenth: precision 0.3 < 0.5
    assert t.scale("shop", "uncertain_turn") == pytest.approx(0.8)
    moved = t.uncertainty("shop", UncertaintyPolicyConfig(target_rate=0.05))
    assert moved.target_rate == pytest.approx(0.04)
    assert t.uncertainty("other", UncertaintyPolicyConfig(target_rate=0.05)).target_rate == 0.05  # per agent
    [entry] = [e for e in logs if e["event"] == "alerting.threshold_moved"]
    assert entry["agent"] == "shop" and entry["kind"] == "uncertain_turn" and entry["direction"] == "stricter"
    assert (entry["scale_before"], entry["scale_after"], entry["true_alarms"], entry["false_alarms"]) == (
        1.0,
        0.8,
        3,
        7,
    )
    assert (entry["target_rate_before"], entry["target_rate_after"], entry["epoch"]) == (0.05, 0.04, 0)
    labels = {"agent": "shop", "kind": "uncertain_turn"}
    assert registry.get_sample_value("sidecar_alert_threshold_scale", labels) == pytest.approx(0.8)
    assert registry.get_sample_value("sidecar_alert_threshold_moves_total", {**labels, "direction": "stricter"}) == 1
    detail = t.health().detail
    assert "shop uncertain_turn: target rate x0.800 (3 true, 7 false)" in detail and t.health().ready


def test_moves_stay_within_the_bounds_and_true_alarms_bring_the_rule_back() -> None:
    registry = CollectorRegistry()
    t = make(registry, **ON)
    with capture_logs() as logs:
        judge(t, "F" * 200)
    # 1 -> 0.8 -> 0.64 -> 0.512 -> 0.5 (the floor), then no more moves
    assert t.scale("shop", "uncertain_turn") == 0.5
    assert len([e for e in logs if e["event"] == "alerting.threshold_moved"]) == 4
    with capture_logs() as logs:
        judge(t, "T" * 200)  # precision 0.5: back to configured, never above
    assert t.scale("shop", "uncertain_turn") == 1.0
    directions = [e["direction"] for e in logs if e["event"] == "alerting.threshold_moved"]
    assert directions == ["relaxed"] * 4
    assert t.uncertainty("shop", UncertaintyPolicyConfig(target_rate=0.05)).target_rate == 0.05
    assert t.health().detail == "epoch 0: as configured (no feedback move yet)"


def test_the_same_judgements_in_any_order_give_the_same_threshold() -> None:
    """What replicas need: each reads the ledger's rows in its own order (or after compaction)."""
    rng = random.Random(7)
    verdicts = [rng.choice("TFF") for _ in range(300)]
    finals = set()
    for _ in range(5):
        rng.shuffle(verdicts)
        t = make(**ON)
        judge(t, "".join(verdicts))
        finals.add(t.scale("shop", "uncertain_turn"))
    assert len(finals) == 1
    [final] = finals
    assert final == scale_for(verdicts.count("T"), verdicts.count("F"), FeedbackThresholdsConfig(**ON)) < 1.0


def test_a_removed_judgement_comes_out_of_the_tally() -> None:
    t = make(**ON)
    judge(t, "F" * 10)
    assert t.scale("shop", "uncertain_turn") == pytest.approx(0.8)
    t.count("shop", "uncertain_turn", true_alarm=False, delta=-1)
    assert t.tally("shop", "uncertain_turn") == (0, 9)
    assert t.scale("shop", "uncertain_turn") == 1.0
    t.count("shop", "uncertain_turn", true_alarm=True, delta=-5)  # never below zero
    assert t.tally("shop", "uncertain_turn") == (0, 9)


def test_other_kinds_never_move() -> None:
    t = make(**ON)
    for _ in range(50):
        t.judged("shop", "conversation_stalled", true_alarm=False)
    assert t.scale("shop", "conversation_stalled") == 1.0


def _tree(i: int, rng: random.Random) -> Effect:
    ctx = TurnContext("user_message", f"c{i}", 1, (Message("user", "hi"),), "shop", None)
    tree = TreeScored(rng.randint(1, 9), 1, -rng.random() * 5, -0.3, 10, None, "base")
    return Effect(ctx, (tree,), {})


def _flagged(thresholds: FeedbackThresholds | None) -> int:
    config = AlertingConfig.model_validate(
        {
            "policy": {
                "max_alerts_per_minute": 0,
                "uncertainty": {"target_rate": 0.2, "window_trees": 100, "min_trees": 20},
            }
        }
    )
    esc = Escalations(
        config, [], AlertMetrics(CollectorRegistry()), group="g", agent_label=AgentLabels(), thresholds=thresholds
    )
    rng = random.Random(3)
    return sum(1 for i in range(600) if esc.decide(_tree(i, rng)))


def test_the_uncertain_turn_rule_feels_the_move() -> None:
    stricter = make(**ON)
    judge(stricter, "F" * 40, agent="shop")  # four steps -> the 0.5 floor: half the configured rate
    assert stricter.scale("shop", "uncertain_turn") == 0.5
    configured, moved = _flagged(None), _flagged(stricter)
    assert configured > 0
    assert moved < configured * 0.75  # about half as many uncertain-turn alerts
    assert _flagged(make(**{**ON, "adapt_thresholds": False})) == configured  # reversible by config


def _feedback(offset: int, cid: str, eid: str, rating: str) -> Rec:
    aid = alert_id("g", cid, 1, "uncertain_turn")
    body = {"target": "alert", "rating": rating, "turn": 1, "alert_id": aid}
    ev = {"conversation_id": cid, "event_id": eid, "ts": 1.0, "type": "feedback", "feedback": body}
    return Rec("t", 0, offset, cid.encode(), json.dumps(ev).encode())


async def test_feedback_events_move_the_threshold_once_through_a_restart() -> None:
    """Without a ledger (a stage built without Kafka): ten false alarms arrive as feedback events;
    the process restarts from a commit taken before them and replays: the journal keeps the replay
    from counting them a second time, and the in-process tally starts again from nothing."""
    j = FakeJournal()

    def processor(commit: Any) -> tuple[PartitionProcessor, FeedbackThresholds]:
        thresholds = make(**ON)
        sink = AlertFeedback("g", FeedbackMetrics(CollectorRegistry()), AgentLabels(), thresholds=thresholds)
        p = PartitionProcessor(
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
        return p, thresholds

    recs: list[Rec] = [record(0, event("c", 0, "user", agent=None))]
    recs += [_feedback(1 + i, "c", f"f{i}", "false_alarm") for i in range(10)]
    first, thresholds = processor(None)
    await first.process(recs[0], 0.0)
    commit = first.commit_point()
    for r in recs[1:]:
        await first.process(r, 0.0)
    assert await first.drain(5)
    assert thresholds.scale("default", "uncertain_turn") == pytest.approx(0.8)
    again, restarted = processor(commit)
    for r in recs:
        await again.process(r, 0.0)
    assert await again.drain(5)
    assert restarted.scale("default", "uncertain_turn") == 1.0  # nothing applied twice (nor again)
    assert len([r for r in j.results if r["kind"] == "feedback"]) == 10


def test_readyz_lists_the_thresholds_and_the_app_wires_one_ledger() -> None:
    from sidecar.alerting.ledger import FeedbackLedger
    from sidecar.app import build_hooks
    from sidecar.config import SidecarConfig

    config = SidecarConfig.model_validate({"alerting": {"feedback": ON}})
    assembly = build_hooks(config, CollectorRegistry())
    [reporter] = [h for h in assembly.health if h.health().name == "alert_thresholds"]
    assert isinstance(reporter, FeedbackThresholds)
    assert isinstance(assembly.feedback, AlertFeedback) and assembly.feedback.thresholds is reporter
    ledger = assembly.feedback.ledger
    assert isinstance(ledger, FeedbackLedger) and ledger in assembly.components and ledger.thresholds is reporter
    assert ledger.topic == f"{config.kafka.topic}.alert-feedback"
    # Until the ledger has read its topic this replica's thresholds may differ from the fleet's.
    assert not reporter.health().ready and "reading the judgements" in reporter.health().detail
    reporter.waiting_for = None
    judge(reporter, "F" * 10, agent="default")
    assert reporter.health().detail == (
        "epoch 0: moved by feedback: default uncertain_turn: target rate x0.800 (0 true, 10 false)"
    )
    off = build_hooks(SidecarConfig.model_validate({}), CollectorRegistry())
    assert isinstance(off.feedback, AlertFeedback) and off.feedback.ledger is None
