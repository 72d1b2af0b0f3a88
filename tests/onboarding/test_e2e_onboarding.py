"""End to end: an agent the sidecar has no adapter for gets one from its own stream, and is scored with it.

Kafka (librdkafka's mock cluster) carries contract-v1 events of an unseen agent. The sidecar scores
them with the instruct fallback (``completion_source: instruct``) and, redacting PII on arrival,
keeps each finished conversation in its training store. ``adapters onboard`` reads that store,
trains an adapter on the suite's tiny model, validates it on the held-back slice, exports it,
loads it into the suite's running vLLM CPU server (``/v1/load_lora_adapter``) and patches the
sidecar's config. The sidecar restarted on that config scores the agent's later conversations with
the new adapter, and the results topic says so.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from adapters.cli import main
from sidecar.config import load_config
from sidecar.tools.demo.mock_cluster import MockKafkaCluster
from sidecar.tools.demo.replay import conversation_events, encode, interleave
from sidecar.tools.ports import free_port
from tests.adapters.conftest import synthetic_conversation
from tests.integration.kafka_support import produce_raw, read_topic, write_config
from tests.integration.test_kafka_source import Running
from tests.support.vllm_server import VllmServer

pytestmark = pytest.mark.filterwarnings("ignore:.*is_gradient_checkpointing.*:FutureWarning")

AGENT = "fresh-agent"
EMAIL = "jane.doe@example.com"
FIRST, LATER = 60, 8


def _events(start: int, n: int) -> list[list[dict[str, Any]]]:
    convs = []
    for i in range(start, start + n):
        rec = synthetic_conversation(i, 2 + i % 4)
        if i == start:
            rec["turns"][0]["content"] += f" mail me at {EMAIL}"
        convs.append(conversation_events(rec, agent=AGENT, conversation_id=f"c{i}"))
    return convs


async def _adapter_check(port: int) -> dict[str, Any]:
    async with httpx.AsyncClient() as http:
        body = (await http.get(f"http://127.0.0.1:{port}/readyz")).json()
    check: dict[str, Any] = next(c for c in body["checks"] if c["name"] == "completion_adapters")
    return check


async def _ended(bs: str, topic: str, ids: set[str], limit_seconds: float = 300) -> list[dict[str, Any]]:
    deadline = asyncio.get_running_loop().time() + limit_seconds
    while True:
        results = [json.loads(r.value) for r in await read_topic(bs, topic)]
        ended = [v for v in results if v["kind"] == "conversation_ended" and v["conversation_id"] in ids]
        if len(ended) >= len(ids) or asyncio.get_running_loop().time() > deadline:
            return ended
        await asyncio.sleep(1)


@pytest.mark.slow
async def test_an_unseen_agent_is_onboarded_from_its_own_stream(
    vllm_server: VllmServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = tmp_path / "store"
    port = free_port()
    with MockKafkaCluster(1) as kafka:
        bs = kafka.bootstrap_servers
        path = write_config(
            tmp_path / "sidecar.yaml",
            bs,
            "onb",
            state={"redaction": {"enabled": True}},
            scoring={
                "enabled": True,
                "vllm": {"base_url": vllm_server.base_url, "base_model": "base"},
                "tokenizer": {"model_dir": str(vllm_server.model_dir)},
                "default_agent": {"completion_sample_rate": 0.0},  # final verdicts only: quicker
                "tree": {"enabled": False},
                "completion": {"max_remaining_tokens": 4},
            },
            training_store={"enabled": True, "directory": str(store), "agents": [AGENT]},
            http={"port": port},
        )
        first = _events(0, FIRST)
        await produce_raw(bs, "onb", [encode(e) for e in interleave(first, concurrency=10, seed=1)])
        r = Running(load_config(path))
        await r.wait_for(
            "sidecar_training_store_conversations_total", FIRST, limit_seconds=300, agent=AGENT, result="written"
        )
        before = await _ended(bs, "onb.results", {f"c{i}" for i in range(FIRST)})
        untrusted = await _adapter_check(port)
        await r.close()
        assert untrusted["ready"] and not untrusted["gates"]  # shown, never blocking
        assert "no trustworthy adapter for (other agents): instruct" in untrusted["detail"]
        assert {v["outcome"]["scoring"]["completion_source"] for v in before} == {"instruct"}
        stored = "".join(p.read_text() for p in (store / AGENT).iterdir())
        assert EMAIL not in stored and "[EMAIL]" in stored  # redacted on arrival, before anything kept it

        argv = [
            "onboard",
            "--agent",
            AGENT,
            "--source",
            str(store),
            "--out",
            str(tmp_path / "onboard"),
            "--base",
            str(vllm_server.model_dir),
            "--max-context-tokens",
            "256",
            "--lr",
            "3e-3",
            "--min-steps",
            "60",
            "--vllm-url",
            vllm_server.base_url,
            "--config",
            str(path),
        ]
        assert await asyncio.to_thread(main, argv) == 0
        out = capsys.readouterr().out
        result = json.loads(out[out.rindex("\n{\n") + 1 :] if not out.startswith("{") else out)
        assert result["serve"] == "loaded" and result["trusted"], result
        async with httpx.AsyncClient() as http:
            models = (await http.get(vllm_server.base_url + "/models")).json()
        assert result["served_name"] in {m["id"] for m in models["data"]}

        later = _events(FIRST, LATER)
        await produce_raw(bs, "onb", [encode(e) for e in interleave(later, concurrency=4, seed=2)])
        r = Running(load_config(path))  # the patched config: the agent now routes to its adapter
        after = await _ended(bs, "onb.results", {f"c{i}" for i in range(FIRST, FIRST + LATER)})
        trusted = r.metric("sidecar_completion_adapter_trusted", agent=AGENT)
        check = await _adapter_check(port)
        await r.close()
    assert f"trusted: {AGENT}" in check["detail"]
    assert len(after) == LATER
    for v in after:
        scoring = v["outcome"]["scoring"]
        assert scoring["adapter"] == result["served_name"], scoring
        assert scoring["completion_source"] == "adapter"
        assert scoring["completion_rule"] == result["rule"]
        assert scoring["variant"] == "adapter" and 0.0 <= scoring["p_end"] <= 1.0
    assert trusted == 1.0
