"""Wired in the app: feedback posted to the OTLP receiver as a span event reaches the sidecar's
pipeline, is counted against the alert it names, and a retried request changes nothing twice."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from opentelemetry.proto.common.v1.common_pb2 import KeyValue

from sidecar.alerting.alert import alert_id
from sidecar.config import load_config
from sidecar.tools.ports import free_port
from tests.integration.kafka_support import read_topic, write_config
from tests.integration.test_kafka_source import Running
from tests.otel.spans import any_value, chat_attrs, conversation, encode, make_span, model_calls, traces


@pytest.mark.slow
async def test_span_event_feedback_through_the_receiver(kafka: str, tmp_path: Path, running: list[Running]) -> None:
    topic, port = "otel-feedback", free_port()
    receiver = {"enabled": True, "host": "127.0.0.1", "port": port, "allow_unauthenticated": True}
    cfg = load_config(write_config(tmp_path / "c.yaml", kafka, topic, otel={"receiver": receiver}))
    call = model_calls(conversation(2))[-1]
    review = make_span({"gen_ai.conversation.id": "app-fb", "gen_ai.agent.name": "desk"}, name="review")
    ev = review.events.add()
    ev.name = "sidecar.feedback"
    ev.time_unix_nano = review.end_time_unix_nano
    attrs = {
        "sidecar.feedback.target": "alert",
        "sidecar.feedback.rating": "false_alarm",
        "sidecar.feedback.turn": 1,
        "sidecar.feedback.alert_id": alert_id(f"g-{topic}", "app-fb", 1, "uncertain_turn"),
    }
    ev.attributes.extend(KeyValue(key=k, value=any_value(v)) for k, v in attrs.items())
    chat = make_span(chat_attrs("genai", call, "app-fb"))

    async def post() -> None:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
            for payload in ([chat], [review]):
                body = encode(traces(payload), "otlp_proto")
                answer = await client.post(
                    "/v1/traces", content=body, headers={"Content-Type": "application/x-protobuf"}
                )
                assert answer.status_code == 200

    r = Running(cfg)
    running.append(r)
    await r.ready.wait()
    await post()
    await post()  # an exporter's retry: the same spans, the same event ids
    await r.wait_for("sidecar_hooks_fired_total", 1, kind="feedback")
    # The door already knows the history (nothing new to derive); the feedback is derived again,
    # with the same id, and the sidecar drops the copy.
    await r.wait_for("sidecar_events_dead_lettered_total", 1, reason="duplicate_event")
    assert r.metric("sidecar_otel_spans_total", door="receiver", outcome="feedback") == 2
    labels = {"agent": "desk", "kind": "uncertain_turn", "verdict": "false_alarm"}
    assert r.metric("sidecar_alert_feedback_total", **labels) == 1
    await r.close()
    journaled = [json.loads(x.value) for x in await read_topic(kafka, f"{topic}.results", idle_seconds=0.5)]
    assert [j["outcome"]["alert_kind"] for j in journaled if j["kind"] == "feedback"] == ["uncertain_turn"]
