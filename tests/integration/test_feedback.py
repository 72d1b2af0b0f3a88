"""Feedback through Kafka on librdkafka's mock cluster: applied once, counted per agent and kind,
journaled in the results topic, dead-lettered with its reason when duplicate, unknown or hostile,
and still a duplicate after a restart."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sidecar.alerting.alert import alert_id
from tests.integration.kafka_support import produce_raw, read_topic
from tests.integration.test_kafka_source import Running, config, end, msg


def feedback(cid: str, eid: str, body: Any, **over: Any) -> tuple[bytes, bytes]:
    ev = {"conversation_id": cid, "event_id": eid, "ts": 2.0, "type": "feedback", "feedback": body, **over}
    return cid.encode(), json.dumps(ev).encode()


def dead_reasons(records: list[Any]) -> list[str]:
    return sorted(dict(r.headers)["dlq.reason"].decode() for r in records)


async def test_feedback_is_applied_once_and_refused_with_reasons(
    kafka: str, tmp_path: Path, running: list[Running]
) -> None:
    topic = "fb1"
    group = f"g-{topic}"
    incomplete = alert_id(group, "a", 2, "conversation_incomplete")
    conversation = [msg("a", 0, "user"), msg("a", 1, "assistant"), msg("a", 2, "user"), msg("a", 3, "assistant")]
    await produce_raw(
        kafka,
        topic,
        [
            *conversation,
            feedback("a", "f-turn", {"target": "turn", "rating": "down", "turn": 1, "reason": "it booked Tuesday"}),
            end("a", 4),  # the feedback took no seq: the end is still seq 4
            feedback("a", "f-alert", {"target": "alert", "rating": "false_alarm", "turn": 2, "alert_id": incomplete}),
            feedback("a", "f-alert", {"target": "alert", "rating": "false_alarm", "turn": 2, "alert_id": incomplete}),
            feedback("ghost", "f-ghost", {"target": "conversation", "rating": "up"}),
            feedback("a", "f-forged", {"target": "alert", "rating": "true_alarm", "turn": 2, "alert_id": "0" * 32}),
            feedback("a", "f-hostile", {"target": "conversation", "rating": "up", "reason": "x" * 5000}),
        ],
    )
    cfg = config(tmp_path, kafka, topic)
    r1 = Running(cfg)
    running.append(r1)
    await r1.wait_for("sidecar_hooks_fired_total", 2, kind="feedback")
    for reason in ("duplicate_event", "unknown_conversation", "unknown_alert", "schema"):
        await r1.wait_for("sidecar_events_dead_lettered_total", 1, reason=reason)
    assert r1.metric("sidecar_feedback_total", agent="shop", target="turn", rating="down") == 1
    assert r1.metric("sidecar_feedback_total", agent="default", target="alert", rating="false_alarm") == 1
    labels = {"agent": "default", "kind": "conversation_incomplete"}
    assert r1.metric("sidecar_alert_feedback_total", **labels, verdict="false_alarm") == 1
    assert r1.registry.get_sample_value("sidecar_alert_precision", labels) == 0.0
    await r1.wait_for("sidecar_commits_total", 1, result="ok")
    await r1.close()

    # After a restart the same feedback is still a duplicate; a new one is applied.
    await produce_raw(
        kafka,
        topic,
        [
            feedback("a", "f-turn", {"target": "turn", "rating": "down", "turn": 1}),
            feedback("a", "f-new", {"target": "conversation", "rating": "up"}, agent="shop"),
        ],
    )
    r2 = Running(cfg)
    running.append(r2)
    await r2.wait_for("sidecar_hooks_fired_total", 1, kind="feedback")
    await r2.wait_for("sidecar_events_dead_lettered_total", 1, reason="duplicate_event")
    assert r2.metric("sidecar_feedback_total", agent="shop", target="conversation", rating="up") == 1
    assert r2.metric("sidecar_feedback_total", agent="shop", target="turn", rating="down") == 0
    await r2.close()

    journaled = [json.loads(r.value) for r in await read_topic(kafka, f"{topic}.results")]
    fed = [r["outcome"]["event_id"] for r in journaled if r["kind"] == "feedback"]
    assert sorted(fed) == ["f-alert", "f-new", "f-turn"]
    assert "Tuesday" not in json.dumps(journaled)
    assert sum(1 for r in journaled if r["kind"] == "conversation_ended") == 1
    assert dead_reasons(await read_topic(kafka, f"{topic}.dlq")) == [
        "duplicate_event",
        "duplicate_event",
        "schema",
        "unknown_alert",
        "unknown_conversation",
    ]
