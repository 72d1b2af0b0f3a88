"""Many conversations streamed as contract-v1 events: valid, in order, interleaved, paced."""

from __future__ import annotations

import itertools
import json
import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from sidecar.events import decode_event
from sidecar.judge.chat import ChatMessage
from sidecar.tools.demo.replay import event_id
from sidecar.tools.simulator.agents import AssistantAgent, SummaryChecker, UserAgent
from sidecar.tools.simulator.config import SimulatorConfig
from sidecar.tools.simulator.dialogue import Dialogue
from sidecar.tools.simulator.goals import GoalSpec
from sidecar.tools.simulator.metrics import SimulatorMetrics
from sidecar.tools.simulator.runner import RunPlan, run_summary, simulate_all
from sidecar.tools.simulator.writers import JsonlEventWriter, RatePacer
from tests.simulator.fakes import ScriptedChat, is_user_agent


def chatty(messages: Sequence[ChatMessage], schema: Mapping[str, Any] | None) -> str:
    return "I need a table." if is_user_agent(messages) else "What time?"


def make_dialogue(**cfg: Any) -> Dialogue:
    chat = ScriptedChat(chatty)
    config = SimulatorConfig(**cfg)
    return Dialogue(config, UserAgent(chat), AssistantAgent(chat, "builtin"), SummaryChecker(chat))


async def simulate(tmp_path: Path, goals: int, *, turns: int, concurrency: int, rate: float | None = None,
                   registry: CollectorRegistry | None = None) -> tuple[list[dict[str, Any]], Any]:  # fmt: skip
    writer = JsonlEventWriter(tmp_path / "events.jsonl")
    await writer.start()
    specs = [GoalSpec(f"g{i}", f"goal number {i}") for i in range(goals)]
    plan = RunPlan("shop", "acme", concurrency, rate, "sim-t-")
    metrics = SimulatorMetrics(registry or CollectorRegistry())
    try:
        convs = await simulate_all(specs, make_dialogue(max_turns=turns), writer, plan, metrics)
    finally:
        await writer.stop()
    lines = (tmp_path / "events.jsonl").read_bytes().splitlines()
    return [json.loads(x) for x in lines], convs


async def test_every_event_is_valid_and_each_conversation_is_in_order(tmp_path: Path) -> None:
    registry = CollectorRegistry()
    events, convs = await simulate(tmp_path, goals=6, turns=3, concurrency=3, registry=registry)
    by_conv: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for e in events:
        raw = json.dumps(e, separators=(",", ":")).encode()
        decoded = decode_event(raw, e["conversation_id"].encode(), max_bytes=1 << 20)  # the sidecar's own decoder
        assert decoded.agent == "shop" and decoded.tenant == "acme"
        by_conv[e["conversation_id"]].append(e)
    assert sorted(by_conv) == [f"sim-t-{i:06d}" for i in range(6)]
    for cid, evs in by_conv.items():
        assert [e["seq"] for e in evs] == list(range(len(evs)))
        assert [e["event_id"] for e in evs] == [event_id(cid, s) for s in range(len(evs))]
        assert [e["type"] for e in evs] == ["message"] * (len(evs) - 1) + ["conversation_end"]
        assert len(evs) == 1 + 2 * 3 + 1  # greeting, 3 turns, end
        assert [e["ts"] for e in evs] == sorted(e["ts"] for e in evs)
    # Live streaming with concurrency 3: conversations interleave rather than follow each other.
    first_ids = [e["conversation_id"] for e in events[:6]]
    assert len(set(first_ids)) > 1
    assert registry.get_sample_value("sidecar_simulator_events_total") == len(events)
    assert registry.get_sample_value("sidecar_simulator_conversations_total", {"end_reason": "turn_limit"}) == 6
    summary = run_summary(convs, len(events), 1.0)
    assert summary["end_reasons"]["turn_limit"] == 6 and summary["turns"]["max"] == 3
    assert summary["cost"]["user"]["calls"] == 18 and summary["cost_per_conversation"]["assistant"]["calls"] == 4


async def test_rate_bounds_the_event_stream(tmp_path: Path) -> None:
    t0 = time.monotonic()
    events, _ = await simulate(tmp_path, goals=2, turns=2, concurrency=2, rate=40.0)
    elapsed = time.monotonic() - t0
    assert len(events) == 12
    assert elapsed >= (len(events) - 1) / 40.0 * 0.95
    # Slots are 1/rate apart; one late send makes the next gap shorter, never the average rate higher.
    assert events[-1]["ts"] - events[0]["ts"] >= (len(events) - 1) / 40.0 * 0.95
    assert all(b["ts"] >= a["ts"] for a, b in itertools.pairwise(events))


async def test_pacer_without_rate_does_not_wait() -> None:
    pacer = RatePacer(None)
    t0 = time.monotonic()
    for _ in range(1000):
        await pacer.wait()
    assert time.monotonic() - t0 < 0.5


async def test_a_conversation_that_never_started_emits_nothing(tmp_path: Path) -> None:
    from sidecar.judge.chat import ChatRequestError

    def failing(messages: Sequence[ChatMessage], schema: Mapping[str, Any] | None) -> str:
        raise ChatRequestError("http_400", "refused")

    chat = ScriptedChat(failing)
    dialogue = Dialogue(SimulatorConfig(), UserAgent(chat), AssistantAgent(chat, "builtin"), SummaryChecker(chat))
    writer = JsonlEventWriter(tmp_path / "e.jsonl")
    await writer.start()
    convs = await simulate_all([GoalSpec("g", "goal")], dialogue, writer, RunPlan("a", None, 1, None, "p-"),
                               SimulatorMetrics(CollectorRegistry()))  # fmt: skip
    await writer.stop()
    assert convs[0].end_reason == "error" and convs[0].error == "http_400"
    assert (tmp_path / "e.jsonl").read_bytes() == b""
