"""Thresholds moved by feedback, on librdkafka's mock cluster: a replica that owns none of the
feedback's partitions (a ledger reading the judgement topic, as every replica does) holds the same
threshold as the one that took the feedback, a restarted replica gets it back from the topic,
feedback sent again after the restart changes nothing, and raising the epoch puts the configured
threshold back."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from sidecar.alerting.alert import alert_id
from sidecar.alerting.ledger import FeedbackLedger
from sidecar.alerting.thresholds import FeedbackThresholds, ThresholdMetrics
from sidecar.telemetry.labels import AgentLabels
from tests.integration.kafka_support import produce_raw, read_topic
from tests.integration.test_kafka_source import Running, config, msg

FEEDBACK = {"adapt_thresholds": True, "min_judged_alerts": 5, "min_rate_scale": 0.25, "replication_factor": 1}
SCALE = "sidecar_alert_threshold_scale"


def judged(group: str, cid: str, eid: str, turn: int, rating: str) -> tuple[bytes, bytes]:
    body = {"target": "alert", "rating": rating, "turn": turn, "alert_id": alert_id(group, cid, turn, "uncertain_turn")}
    ev = {"conversation_id": cid, "event_id": eid, "ts": 2.0, "type": "feedback", "feedback": body}
    return cid.encode(), json.dumps(ev).encode()


def conversation(cid: str) -> list[tuple[bytes, bytes]]:
    return [msg(cid, 0, "user"), msg(cid, 1, "assistant"), msg(cid, 2, "user"), msg(cid, 3, "assistant")]


async def until_scale(r: Running, value: float, limit_seconds: float = 60) -> None:
    """The gauge moves down and up: poll for equality."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit_seconds
    while True:
        got = r.registry.get_sample_value(SCALE, {"agent": "shop", "kind": "uncertain_turn"})
        if got is not None and got == pytest.approx(value):
            return
        if loop.time() > deadline:
            raise AssertionError(f"{SCALE} stayed at {got}, not {value}")
        if r.task.done():
            r.task.result()
        await asyncio.sleep(0.1)


async def until_tally(thresholds: FeedbackThresholds, tally: tuple[int, int], limit_seconds: float = 30) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit_seconds
    while thresholds.tally("shop", "uncertain_turn") != tally:
        if loop.time() > deadline:
            raise AssertionError(f"tally {thresholds.tally('shop', 'uncertain_turn')}, not {tally}")
        await asyncio.sleep(0.1)


async def test_replicas_agree_a_restart_keeps_the_threshold_and_nothing_counts_twice(
    kafka: str, tmp_path: Path, running: list[Running]
) -> None:
    topic = "fbl1"
    group = f"g-{topic}"
    conversations = [f"c{i}" for i in range(6)]  # spread over the source's partitions
    await produce_raw(kafka, topic, [r for cid in conversations for r in conversation(cid)])
    # Six false alarms: precision 0 over 6 judged, 3 true alarms short, 2.5 per step: two steps.
    first = [judged(group, cid, f"f-{cid}", 1, "false_alarm") for cid in conversations]
    await produce_raw(kafka, topic, first)
    cfg = config(tmp_path, kafka, topic, alerting={"feedback": FEEDBACK})
    observer = FeedbackLedger(
        cfg.alerting,
        cfg.kafka,
        FeedbackThresholds(cfg.alerting.feedback, ThresholdMetrics(CollectorRegistry())),
        AgentLabels(),
        CollectorRegistry(),
    )
    await observer.start()
    try:
        a = Running(cfg)
        running.append(a)
        await until_scale(a, 0.8**2)
        assert a.metric("sidecar_feedback_total", agent="shop", target="alert", rating="false_alarm") == 6
        await until_tally(observer.thresholds, (0, 6))
        assert observer.thresholds.scale("shop", "uncertain_turn") == pytest.approx(0.8**2)
        assert observer.thresholds.health().ready
        await a.wait_for("sidecar_commits_total", 1, result="ok")
        await a.close()
    finally:
        await observer.stop()

    # Restarted, the same six sent again and three new true alarms: the six are duplicates; the
    # threshold comes back from the topic and only the three new ones move it (3 of 9: 1.5 short).
    again = [judged(group, cid, f"f-{cid}", 1, "false_alarm") for cid in conversations]
    new = [judged(group, cid, f"t-{cid}", 2, "true_alarm") for cid in conversations[:3]]
    await produce_raw(kafka, topic, again + new)
    c = Running(cfg)
    running.append(c)
    await c.wait_for("sidecar_events_dead_lettered_total", 6, reason="duplicate_event")
    await until_scale(c, 0.8)
    rows = await read_topic(kafka, f"{topic}.alert-feedback")
    keys = [r.key.decode() for r in rows]
    assert sorted(set(keys)) == sorted(
        [f"f-{cid}" for cid in conversations] + [f"t-{cid}" for cid in conversations[:3]]
    )
    verdicts = {r.key.decode(): json.loads(r.value)["verdict"] for r in rows}
    assert sum(v == "false_alarm" for v in verdicts.values()) == 6
    await c.close()

    # Reversible: a new epoch counts none of the old judgements.
    reset = config(tmp_path, kafka, topic, alerting={"feedback": {**FEEDBACK, "epoch": 1}})
    d = Running(reset)
    running.append(d)
    await d.wait_for("sidecar_fleet_table_caught_up", 1, table="alert-feedback")
    assert d.registry.get_sample_value(SCALE, {"agent": "shop", "kind": "uncertain_turn"}) is None  # never moved
    await d.close()
