"""Wired in the app: spans posted to the receiver reach the sidecar's own pipeline, and a retried
request is dropped by its dedup (each outcome once in the results topic)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import httpx
import pytest

from sidecar.config import load_config
from sidecar.evaluations.results import record_id
from sidecar.tools.ports import free_port
from tests.evaluations.receivers import OtlpReceiver
from tests.evaluations.test_restart import Verdicts
from tests.integration.kafka_support import read_topic, result_keys, write_config
from tests.integration.test_kafka_source import Running
from tests.otel.spans import chat_attrs, conversation, encode, make_span, model_calls, new_id, traces


@pytest.mark.slow
async def test_receiver_feeds_the_pipeline_exactly_once(kafka: str, tmp_path: Path, running: list[Running]) -> None:
    topic, port = "otel-app", free_port()
    cfg = load_config(
        write_config(
            tmp_path / "c.yaml",
            kafka,
            topic,
            otel={"receiver": {"enabled": True, "host": "127.0.0.1", "port": port, "allow_unauthenticated": True}},
        )
    )
    calls = model_calls(conversation(2))

    async def post(chat_calls: list[list[dict[str, object]]]) -> None:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
            for call in chat_calls:
                body = encode(traces([make_span(chat_attrs("genai", call, "app-1"))]), "otlp_proto")
                answer = await client.post(
                    "/v1/traces", content=body, headers={"Content-Type": "application/x-protobuf"}
                )
                assert answer.status_code == 200

    r = Running(cfg)
    running.append(r)
    await r.ready.wait()
    await post(calls)
    await r.wait_for("sidecar_events_consumed_total", len(conversation(2)))
    assert r.metric("sidecar_otel_events_produced_total", door="receiver") == len(conversation(2))
    await r.close()
    # Restarted, the door has forgotten the conversation; an exporter retries the last batch: the
    # whole history is derived again, with the same ids, and the sidecar's dedup drops all of it.
    r = Running(cfg)
    running.append(r)
    await r.ready.wait()
    await post(calls[-1:])
    await r.wait_for("sidecar_events_dead_lettered_total", len(conversation(2)), reason="duplicate_event")
    await r.close()
    keys = Counter(result_keys(await read_topic(kafka, f"{topic}.results", idle_seconds=0.5)))
    assert keys[("app-1", 1, "user_message")] == 1
    assert keys[("app-1", 2, "user_message")] == 1
    assert keys[("app-1", 1, "turn_closed")] == 1
    assert max(keys.values()) == 1


@pytest.mark.slow
async def test_results_are_parented_to_the_evaluated_spans(kafka: str, tmp_path: Path, running: list[Running]) -> None:
    """Spans in through the receiver -> events carrying their span -> the sidecar's post-score stage
    -> gen_ai.evaluation.result log records over OTLP, each on the span the verdict is about; the
    agent's end marker ends the conversation (end_event, not the idle TTL)."""
    topic, port = "otel-parented", free_port()
    results = OtlpReceiver()
    await results.start()
    retry = {"initial_backoff_seconds": 0.01, "max_backoff_seconds": 0.05}
    cfg = load_config(
        write_config(
            tmp_path / "c.yaml",
            kafka,
            topic,
            otel={
                "receiver": {"enabled": True, "host": "127.0.0.1", "port": port, "bearer_token": "tok"},
                "conversation_end": {"markers": [{"attribute": "app.conversation.ended"}]},
            },
            evaluations={
                "otlp": {
                    "enabled": True,
                    "endpoint": results.endpoint,
                    "delivery": {"flush_seconds": 0.05, "retry": retry},
                }
            },
        )
    )
    history = conversation(2)
    calls = model_calls(history)  # four model calls: turn 1 has two, turn 2 has two
    trace = new_id(16)
    spans = [
        make_span(chat_attrs("genai", call, "par-1"), trace_id=trace, start=10 + i) for i, call in enumerate(calls)
    ]
    marker = make_span({"app.conversation.ended": True}, trace_id=trace, parent=spans[-1].span_id, start=100)
    r = Running(cfg, hooks=Verdicts())
    running.append(r)
    try:
        await r.ready.wait()
        async with httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{port}", headers={"Authorization": "Bearer tok"}
        ) as client:
            for payload in [[s] for s in spans[:-1]] + [[spans[-1], marker]]:
                body = encode(traces(payload), "otlp_json")
                answer = await client.post("/v1/traces", content=body, headers={"Content-Type": "application/json"})
                assert answer.status_code == 200
        await r.wait_for("sidecar_hooks_fired_total", 1, kind="conversation_ended")
        await r.wait_for("sidecar_evaluation_results_delivered_total", 6, sink="otlp")
        await r.close()
    finally:
        await results.stop()
    journal = [json.loads(x.value) for x in await read_topic(kafka, f"{topic}.results", idle_seconds=0.5)]
    assert [v["end_reason"] for v in journal if v["kind"] == "conversation_ended"] == ["end_event"]
    got = {rec.uid: rec for rec in results.records()}
    expected = {
        # a tree is about the reply to come: the model call that answered the user message
        record_id("par-1", 1, "user_message", "response_uncertainty"): spans[0],
        # a turn's completion: the model call that gave the agent's last reply of the turn
        record_id("par-1", 1, "turn_closed", "goal_completion"): spans[1],
        record_id("par-1", 2, "user_message", "response_uncertainty"): spans[2],
        record_id("par-1", 2, "turn_closed", "goal_completion"): spans[3],
        record_id("par-1", 2, "conversation_ended", "goal_completion"): spans[3],
        record_id("par-1", 2, "conversation_ended", "user_goal"): spans[3],
    }
    assert set(got) == set(expected)
    for uid, span in expected.items():
        assert (got[uid].trace_id, got[uid].span_id) == (trace.hex(), span.span_id.hex()), uid
        assert "gen_ai.conversation.id" not in got[uid].attributes  # parented, so not needed
