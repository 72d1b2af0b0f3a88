"""Simulator -> Kafka (librdkafka's mock cluster) -> sidecar, end to end and live.

The sidecar runs in-process (``run_app``) with the completion scorer and the judge as its hooks,
both on the real vLLM CPU server. The simulator streams conversations into the source topic while
the sidecar consumes. Every simulated conversation must be seen (one outcome per turn and hook
kind), scored (a P(end) on its final verdict) and judged, and finalised (one conversation_ended
record), and nothing may reach the dead-letter topic.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from sidecar.judge.config import JudgeConfig
from sidecar.judge.hooks import JudgeHooks
from sidecar.llm.config import ChatEndpointConfig
from sidecar.scoring.config import ScoringConfig
from sidecar.scoring.hooks import ScoringHooks
from sidecar.state.hooks import CompositeHooks
from sidecar.tools.demo.mock_cluster import MockKafkaCluster
from sidecar.tools.simulator.cli import run_simulation
from sidecar.tools.simulator.config import SimulatorConfig
from sidecar.tools.simulator.writers import KafkaEventWriter
from tests.integration.kafka_support import read_topic
from tests.integration.test_kafka_source import Running, config
from tests.support.vllm_server import VllmServer

TOPIC = "sim"
GOALS = [
    "You want a table for two at an Italian restaurant in the centre tonight at 7pm.",
    "You need a taxi from the station to the museum, leaving at 10:15.",
    "You want to know the opening hours of the science museum on Sunday.",
    "You want to change your flight to Boston from Friday to Saturday morning.",
    "You want a cheap hotel in the north with free parking for two nights.",
    "You want to find a train to Cambridge arriving before 9am on Tuesday.",
]


async def test_every_simulated_conversation_is_seen_scored_and_finalised(
    vllm_server: VllmServer, tmp_path: Path
) -> None:
    goals = tmp_path / "goals.jsonl"
    goals.write_text("".join(json.dumps({"goal": g}) + "\n" for g in GOALS))
    ep = ChatEndpointConfig(base_url=vllm_server.base_url, model=vllm_server.base_model, max_tokens=12,
                            request_timeout_seconds=120, max_concurrency=3)  # fmt: skip
    scoring = ScoringHooks.from_config(
        ScoringConfig.model_validate(
            {
                "enabled": True,
                "vllm": {"base_url": vllm_server.base_url, "base_model": vllm_server.base_model},
                "tokenizer": {"model_dir": str(vllm_server.model_dir)},
                "agents": {"simulated": {"adapter": vllm_server.adapter_model, "tree_sample_rate": 0.0}},
                "completion": {"max_remaining_tokens": 4},
            }
        ),
        CollectorRegistry(),
    )
    judge_registry = CollectorRegistry()
    judge = JudgeHooks(
        JudgeConfig(enabled=True, sample_rate=1.0, llm=ep.model_copy(update={"max_tokens": 24}),
                    max_transcript_chars=1500, max_message_chars=300),
        judge_registry,
    )  # fmt: skip
    with MockKafkaCluster(1) as kafka:
        bs = kafka.bootstrap_servers
        await scoring.start()
        running = Running(config(tmp_path, bs, TOPIC), CompositeHooks({"scoring": scoring, "judge": judge}))
        try:
            await asyncio.wait_for(running.ready.wait(), 60)
            sim = SimulatorConfig(user=ep, assistant=ep, max_turns=3, concurrency=3, rate=100)
            convs = await run_simulation(sim, goals, KafkaEventWriter(bs, TOPIC), limit=None, max_file_bytes=10**6,
                                         id_prefix="e2e-")  # fmt: skip
            await running.wait_for("sidecar_hooks_fired_total", len(convs), limit_seconds=300,
                                   kind="conversation_ended")  # fmt: skip
            results: list[dict[str, Any]] = []
            for _ in range(150):
                results = [json.loads(r.value) for r in await read_topic(bs, f"{TOPIC}.results")]
                if sum(1 for v in results if v["kind"] == "conversation_ended") >= len(convs):
                    break
                await asyncio.sleep(2)
            dead = await read_topic(bs, f"{TOPIC}.dlq", idle_seconds=0.5)
        finally:
            await running.close()
            await scoring.stop()
            await judge.stop()

    assert len(convs) == len(GOALS) and all(c.error is None for c in convs)
    assert dead == []
    keys = Counter((v["conversation_id"], v["turn"] if v["kind"] != "conversation_ended" else 0, v["kind"])
                   for v in results)  # fmt: skip
    for c in convs:
        for turn in range(1, c.turns + 1):  # seen: every turn's hooks, exactly once
            assert keys[(c.conversation_id, turn, "user_message")] == 1
            assert keys[(c.conversation_id, turn, "turn_closed")] == 1
        assert keys[(c.conversation_id, 0, "conversation_ended")] == 1  # finalised, once
    ended = {v["conversation_id"]: v for v in results if v["kind"] == "conversation_ended"}
    assert set(ended) == {c.conversation_id for c in convs}
    for v in ended.values():
        assert v["end_reason"] == "end_event" and v["agent"] == "simulated"
        final = v["outcome"]["scoring"]
        assert 0.0 <= final["p_end"] <= 1.0 and isinstance(final["complete"], bool)  # scored
        verdict = v["outcome"]["judge"]
        assert verdict["verdict"] in ("complete", "incomplete", "undecided") and verdict["calls"] == 2  # judged
        assert verdict["prompt_tokens"] > 0
    judged = sum(judge_registry.get_sample_value("sidecar_judge_conversations_total", {"verdict": k}) or 0
                 for k in ("complete", "incomplete", "undecided", "error"))  # fmt: skip
    assert judged == len(convs)
