"""The simulator against the real vLLM CPU server, whose tiny random model answers nonsense: turn
limits hold, malformed summary checks are counted, the events are valid, the cost is the server's
own token count, and what ``sidecar simulate`` writes, ``sidecar judge`` reads."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from sidecar.events import decode_event
from sidecar.judge.chat import ChatMessage, ChatReply, OpenAIChatClient
from sidecar.llm.config import ChatEndpointConfig
from sidecar.tools.simulator.agents import AssistantAgent, SummaryChecker, UserAgent
from sidecar.tools.simulator.cli import run_simulation
from sidecar.tools.simulator.config import SimulatorConfig
from sidecar.tools.simulator.dialogue import Dialogue
from sidecar.tools.simulator.goals import GoalSpec
from sidecar.tools.simulator.metrics import SimulatorMetrics
from sidecar.tools.simulator.runner import RunPlan, simulate_all
from sidecar.tools.simulator.writers import JsonlEventWriter
from tests.support.vllm_server import VllmServer

GOALS = [
    "You want a table for two at an Italian restaurant in the centre tonight at 7pm.",
    "You need a taxi from the station to the museum, leaving at 10:15.",
    "You want to know the opening hours of the science museum on Sunday.",
    "You want to change your flight to Boston from Friday to Saturday morning.",
]


def endpoint(server: VllmServer, max_tokens: int = 16) -> ChatEndpointConfig:
    return ChatEndpointConfig(base_url=server.base_url, model=server.base_model, max_tokens=max_tokens,
                              request_timeout_seconds=120, max_concurrency=3)  # fmt: skip


def goals_file(tmp_path: Path) -> Path:
    path = tmp_path / "goals.jsonl"
    path.write_text("".join(json.dumps({"goal_id": f"g{i}", "goal": g}) + "\n" for i, g in enumerate(GOALS)))
    return path


def events_of(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_bytes().splitlines()]


async def test_turn_limits_hold_and_events_are_valid(vllm_server: VllmServer, tmp_path: Path) -> None:
    ep = endpoint(vllm_server)
    cfg = SimulatorConfig(user=ep, assistant=ep, max_turns=3, concurrency=3)
    registry = CollectorRegistry()
    convs = await run_simulation(cfg, goals_file(tmp_path), JsonlEventWriter(tmp_path / "ev.jsonl"), limit=None,
                                 max_file_bytes=10**6, id_prefix="sim-v-", registry=registry)  # fmt: skip
    assert len(convs) == 4
    for c in convs:
        assert c.end_reason in ("turn_limit", "goodbye") and c.error is None  # nonsense, but no failure
        assert 1 <= c.turns <= 3
        if c.end_reason == "turn_limit":
            assert c.turns == 3
    events = events_of(tmp_path / "ev.jsonl")
    for e in events:
        decode_event(json.dumps(e).encode(), e["conversation_id"].encode(), max_bytes=1 << 20)
    ends = [e for e in events if e["type"] == "conversation_end"]
    assert sorted(e["conversation_id"] for e in ends) == [f"sim-v-{i:06d}" for i in range(4)]
    assert len(events) == sum(len(c.messages) + 1 for c in convs)
    calls = registry.get_sample_value("sidecar_simulator_llm_calls_total", {"role": "user"})
    assert calls == sum(c.costs["user"].calls for c in convs) == sum(c.turns for c in convs)


async def test_malformed_summary_checks_are_counted(vllm_server: VllmServer, tmp_path: Path) -> None:
    # Every assistant message (even an empty one) counts as a summary here, so the checker runs on the
    # tiny model's nonsense: its answers are malformed, counted, and never an acceptance.
    ep = endpoint(vllm_server)
    cfg = SimulatorConfig(user=ep, assistant=ep, max_turns=3, summary_pattern=r"^")
    chat = OpenAIChatClient(ep)
    dialogue = Dialogue(cfg, UserAgent(chat), AssistantAgent(chat, "builtin"), SummaryChecker(chat))
    registry = CollectorRegistry()
    writer = JsonlEventWriter(tmp_path / "ev.jsonl")
    await writer.start()
    try:
        convs = await simulate_all([GoalSpec("g", GOALS[0])], dialogue, writer, RunPlan("a", None, 1, None, "s-"),
                                   SimulatorMetrics(registry))  # fmt: skip
    finally:
        await writer.stop()
        await chat.aclose()
    (conv,) = convs
    assert conv.checks >= 1 and conv.costs["checker"].calls == conv.checks
    assert conv.invalid_checks >= 1 and conv.error is None
    assert registry.get_sample_value("sidecar_simulator_invalid_checks_total") == conv.invalid_checks
    if not conv.summary_accepted:
        assert conv.end_reason in ("turn_limit", "goodbye")


class Recording:
    """Wraps a client and keeps every request with the reply's reported usage."""

    def __init__(self, inner: OpenAIChatClient) -> None:
        self.inner = inner
        self.log: list[tuple[list[dict[str, str]], ChatReply]] = []

    async def chat(
        self, messages: Sequence[ChatMessage], *, schema: Mapping[str, Any] | None = None, name: str = "answer"
    ) -> ChatReply:
        reply = await self.inner.chat(messages, schema=schema, name=name)
        self.log.append(([dict(m) for m in messages], reply))
        return reply


def tokenize_count(server: VllmServer, chat: list[dict[str, str]]) -> int:
    body = json.dumps({"model": server.base_model, "messages": chat, "add_generation_prompt": True}).encode()
    req = urllib.request.Request(server.root_url + "/tokenize", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        return int(json.loads(resp.read())["count"])


async def test_cost_is_the_servers_token_count(vllm_server: VllmServer, tmp_path: Path) -> None:
    ep = endpoint(vllm_server)
    inner = OpenAIChatClient(ep)
    chat = Recording(inner)
    cfg = SimulatorConfig(user=ep, assistant=ep, max_turns=2)
    dialogue = Dialogue(cfg, UserAgent(chat), AssistantAgent(chat, "builtin"), SummaryChecker(chat))
    writer = JsonlEventWriter(tmp_path / "ev.jsonl")
    await writer.start()
    try:
        (conv,) = await simulate_all([GoalSpec("g", GOALS[1])], dialogue, writer, RunPlan("a", None, 1, None, "c-"),
                                     SimulatorMetrics(CollectorRegistry()))  # fmt: skip
    finally:
        await writer.stop()
        await inner.aclose()
    assert len(chat.log) == sum(c.calls for c in conv.costs.values()) >= 4
    for request, reply in chat.log:
        assert reply.prompt_tokens == tokenize_count(vllm_server, request)
        assert 0 < reply.completion_tokens <= 16
    total = sum(c.prompt_tokens for c in conv.costs.values())
    assert total == sum(r.prompt_tokens for _, r in chat.log)


def test_simulate_then_judge_from_the_command_line(vllm_server: VllmServer, tmp_path: Path) -> None:
    from sidecar.cli import main

    convs, summary = tmp_path / "convs.jsonl", tmp_path / "summary.json"
    rc = main(["simulate", "--goals", str(goals_file(tmp_path)), "--limit", "2", "--user-url", vllm_server.base_url,
               "--user-model", vllm_server.base_model, "--user-max-tokens", "16", "--assistant-max-tokens", "16",
               "--max-turns", "2", "--concurrency", "2", "--rate", "50", "--out", str(tmp_path / "ev.jsonl"),
               "--conversations-out", str(convs), "--summary", str(summary), "--id-prefix", "cli-"])  # fmt: skip
    assert rc == 0
    doc = json.loads(summary.read_text())
    assert doc["conversations"] == 2 and doc["end_reasons"]["error"] == 0 and doc["turns"]["max"] <= 2
    assert doc["events"] == len(events_of(tmp_path / "ev.jsonl"))
    assert doc["cost"]["user"]["prompt_tokens"] > 0 and doc["cost_per_conversation"]["assistant"]["calls"] >= 1
    records = [json.loads(x) for x in convs.read_text().splitlines()]
    assert [r["conversation_id"] for r in records] == ["cli-000000", "cli-000001"]
    assert records[0]["meta"]["goal"] == GOALS[0]
    judged = tmp_path / "judged.json"
    rc = main(["judge", str(convs), "--base-url", vllm_server.base_url, "--model", vllm_server.base_model,
               "--max-tokens", "16", "--summary", str(judged), "--label-field", "meta.summary_accepted"])  # fmt: skip
    assert rc == 0
    result = json.loads(judged.read_text())
    assert result["judged"] == 2 and result["calls"] == 4 and result["classification"]["n"] == 2
