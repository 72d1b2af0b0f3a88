"""The assembled pipeline, end to end: Kafka (mock cluster) -> state -> scoring on the real vLLM
CPU server -> outcomes in the results topic, with LLM-free goal clustering labelling the final
verdicts and GET /clusters serving them."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import aiohttp

from sidecar.tools.demo.mock_cluster import MockKafkaCluster
from sidecar.tools.demo.replay import conversation_events, encode, interleave, load_sample
from sidecar.tools.ports import free_port
from tests.integration.kafka_support import produce_raw, read_topic
from tests.integration.test_kafka_source import Running, config
from tests.support.vllm_server import VllmServer


async def test_kafka_to_vllm_scores_and_goal_clusters(vllm_server: VllmServer, tmp_path: Path) -> None:
    records = load_sample()[:60]
    convs = [conversation_events(r, agent="shop") for r in records]
    expected_ends = len(convs)
    port = free_port()
    with MockKafkaCluster(1) as kafka:
        bs = kafka.bootstrap_servers
        await produce_raw(bs, "e2e", [encode(e) for e in interleave(convs, concurrency=20, seed=3)])
        cfg = config(
            tmp_path,
            bs,
            "e2e",
            http={"port": port},
            scoring={
                "enabled": True,
                "vllm": {"base_url": vllm_server.base_url, "base_model": vllm_server.base_model},
                "tokenizer": {"model_dir": str(vllm_server.model_dir)},
                "agents": {"shop": {"adapter": vllm_server.adapter_model, "tree_sample_rate": 0.2}},
                "tree": {"max_depth_tokens": 8, "max_requests": 8},
                "completion": {"max_remaining_tokens": 8},
            },
            clustering={
                "enabled": True,
                "mode": "extractive",
                "k1": 6,
                "min_conversations": 20,
                "recluster_interval_seconds": 2,
            },
        )
        r = Running(cfg)
        await r.wait_for("sidecar_hooks_fired_total", expected_ends, limit_seconds=600, kind="conversation_ended")
        deadline = asyncio.get_running_loop().time() + 600
        results: list[Any] = []
        while asyncio.get_running_loop().time() < deadline:
            results = [json.loads(x.value) for x in await read_topic(bs, "e2e.results")]
            if sum(1 for v in results if v["kind"] == "conversation_ended") >= expected_ends:
                break
            await asyncio.sleep(2)
        async with aiohttp.ClientSession() as http:
            async with http.get(f"http://127.0.0.1:{port}/clusters") as resp:
                clusters = await resp.json()
            async with http.get(f"http://127.0.0.1:{port}/metrics") as resp:
                metrics = await resp.text()
        await r.close()

    ended = [v for v in results if v["kind"] == "conversation_ended"]
    closed = [v for v in results if v["kind"] == "turn_closed"]
    assert len(ended) == expected_ends
    final = [v["outcome"]["scoring"] for v in ended]
    scored = [o for o in final if "p_end" in o]
    assert scored, final[:3]
    for o in scored:
        assert 0.0 <= o["p_end"] <= 1.0
        assert isinstance(o["complete"], bool)
    assert any("p_end" in v["outcome"]["scoring"] for v in closed)
    trees = [v["outcome"]["scoring"] for v in results if v["kind"] == "user_message"]
    assert any("leaves" in t for t in trees), trees[:3]
    assert all("goal" in v["outcome"]["goals"] for v in ended)
    assert clusters["enabled"] is True
    assert "sidecar_conversations_ended_total" in metrics
    assert "sidecar_completion_probability_bucket" in metrics
    for v in results:  # outcomes never carry message text by default
        assert "remaining" not in json.dumps(v["outcome"]) or v["outcome"]["scoring"].get("remaining") is None
