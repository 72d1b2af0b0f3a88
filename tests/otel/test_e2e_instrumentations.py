"""End to end with the instrumentations agents really use: a small agent (``tests/otel/agent.py``,
its own process) talks to the suite's vLLM CPU server with the ``openai`` client, instrumented in
turn with ``opentelemetry-instrumentation-openai-v2``, ``openinference-instrumentation-openai`` and
OpenLLMetry's ``opentelemetry-instrumentation-openai``, and exports with the SDK's OTLP/HTTP
exporter to the sidecar's receiver. The sidecar runs with scoring on against the same vLLM server.

Proven: the events equal what a native v1 producer would have sent (same messages, same turns);
every conversation is scored (a verdict for each turn and a final one); the agent's end marker ends
each conversation (``end_event``, not the idle TTL); and every verdict leaves as an OTLP evaluation
result parented to the span of the message it is about."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from sidecar.config import load_config
from sidecar.tools.ports import free_port
from tests.evaluations.receivers import OtlpReceiver
from tests.integration.kafka_support import REPO, read_topic, write_config
from tests.integration.test_kafka_source import Running
from tests.otel.agent import AGENT, END_MARKER, INSTRUMENTATIONS
from tests.otel.spans import decoded, dedup, native_events
from tests.support.vllm_server import VllmServer

CONVERSATIONS = 1  # per instrumentation
TURNS = 2
PER_CONVERSATION = 2 * TURNS + 1  # evaluation results
TOKEN = "e2e-token"


async def run_agent(instrumentation: str, vllm: VllmServer, endpoint: str, out: Path) -> dict[str, Any]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.otel.agent",
        f"--instrumentation={instrumentation}",
        f"--base-url={vllm.base_url}",
        f"--model={vllm.base_model}",
        f"--endpoint={endpoint}",
        f"--token={TOKEN}",
        f"--prefix={instrumentation}",
        f"--conversations={CONVERSATIONS}",
        f"--turns={TURNS}",
        f"--out={out}",
        cwd=REPO,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    output, _ = await asyncio.wait_for(proc.communicate(), 300)
    assert proc.returncode == 0, output.decode(errors="replace")[-4000:]
    return json.loads(await asyncio.to_thread(out.read_text))  # type: ignore[no-any-return]


@pytest.mark.slow
async def test_instrumented_agents_are_scored_through_the_receiver(
    vllm_server: VllmServer, kafka: str, tmp_path: Path
) -> None:
    topic, port = "otel-e2e", free_port()
    results = OtlpReceiver()
    await results.start()
    cfg = load_config(
        write_config(
            tmp_path / "c.yaml",
            kafka,
            topic,
            otel={
                "receiver": {"enabled": True, "host": "127.0.0.1", "port": port, "bearer_token": TOKEN},
                "conversation_end": {"markers": [{"attribute": END_MARKER}]},
            },
            scoring={
                "enabled": True,
                "vllm": {"base_url": vllm_server.base_url, "base_model": vllm_server.base_model},
                "tokenizer": {"model_dir": str(vllm_server.model_dir)},
                "agents": {AGENT: {"adapter": vllm_server.adapter_model}},
                "tree": {"max_depth_tokens": 6, "max_requests": 6},
                "completion": {"max_remaining_tokens": 6},
            },
            evaluations={"otlp": {"enabled": True, "endpoint": results.endpoint, "delivery": {"flush_seconds": 0.1}}},
        )
    )
    r = Running(cfg)
    try:
        await r.ready.wait()
        endpoint = f"http://127.0.0.1:{port}/v1/traces"
        transcripts: dict[str, Any] = {}
        for name in INSTRUMENTATIONS:  # one after the other: two cores, and vLLM serves one at a time anyway
            transcripts |= await run_agent(name, vllm_server, endpoint, tmp_path / f"{name}.json")
        total = len(INSTRUMENTATIONS) * CONVERSATIONS
        await r.wait_for("sidecar_hooks_fired_total", total, limit_seconds=600, kind="conversation_ended")
        # each conversation: a tree per user message, a completion per turn and the final verdict
        await r.wait_for("sidecar_evaluation_results_delivered_total", total * PER_CONVERSATION, sink="otlp")
        await r.close()
    finally:
        await results.stop()

    assert set(transcripts) == {f"{i}-{c}" for i in INSTRUMENTATIONS for c in range(CONVERSATIONS)}
    events = dedup(decoded((x.key, x.value) for x in await read_topic(kafka, topic, idle_seconds=0.5)))
    for cid, native in transcripts.items():
        got = events[cid]
        *messages, end = got
        assert [e.message for e in messages] == [e.message for e in native_events(cid, native)], cid
        assert end.type == "conversation_end" and end.seq == len(native)
        assert {e.agent for e in got} == {AGENT}
        assert all(e.span is not None for e in got)

    journal = [json.loads(x.value) for x in await read_topic(kafka, f"{topic}.results", idle_seconds=0.5)]
    ended = {v["conversation_id"]: v for v in journal if v["kind"] == "conversation_ended"}
    assert set(ended) == set(transcripts)
    for cid, v in ended.items():
        assert v["end_reason"] == "end_event", cid
        assert 0.0 <= v["outcome"]["scoring"]["p_end"] <= 1.0, v["outcome"]
    closed = {(v["conversation_id"], v["turn"]) for v in journal if v["kind"] == "turn_closed"}
    assert closed == {(cid, t) for cid in transcripts for t in range(1, TURNS + 1)}
    for v in journal:
        if v["kind"] == "turn_closed":
            assert 0.0 <= v["outcome"]["scoring"]["p_end"] <= 1.0, v["outcome"]

    spans = {(e.span.trace_id, e.span.span_id) for log in events.values() for e in log if e.span is not None}
    assert len({x.uid for x in results.records()}) == len(transcripts) * PER_CONVERSATION
    finals = [x for x in results.records() if x.attributes.get("sidecar.final")]
    assert len({x.uid for x in finals}) == len(transcripts)
    for x in results.records():
        assert (x.trace_id, x.span_id) in spans  # on the span of a message it evaluated
    for cid, log in events.items():
        last_reply = log[-2].span
        assert last_reply is not None
        mine = [x for x in finals if x.attributes.get("sidecar.turn") == TURNS and x.span_id == last_reply.span_id]
        assert mine, cid  # the final verdict sits on the model call that gave the last reply
