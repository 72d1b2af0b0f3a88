"""The tree gate on the real vLLM CPU server: confident turns cost one request and keep the greedy
branch, uncertain ones grow the very tree the gate-less hooks build, and a skipped turn's greedy
branch bounds the full tree's best branch from below (so the best_logprob rule would not flag it)."""

from __future__ import annotations

import inspect
from typing import Any, cast

import pytest
from prometheus_client import CollectorRegistry

from sidecar.contract import HookResult, Outcome, TurnContext
from sidecar.scoring.config import ScoringConfig
from sidecar.scoring.hooks import ScoringHooks
from sidecar.transcript.model import Message
from tests.support.vllm_server import VllmServer

TOPICS = ["a table for two", "a taxi to the station", "a hotel near the river", "train tickets to Leeds",
          "a museum tour", "a cheap restaurant", "a room with a view", "a late checkout", "the 9:15 bus",
          "a quiet cafe", "parking near the centre", "a guest house in the north"]  # fmt: skip


def _turns() -> list[list[Message]]:
    out = []
    for i, topic in enumerate(TOPICS * 2):
        ask = f"I need {topic}." if i < len(TOPICS) else f"Could you find me {topic}, for {i} people?"
        out.append([Message("user", ask)])
    return out


async def _resolve(result: HookResult) -> Outcome:
    return await result if inspect.isawaitable(result) else result


def _hooks(server: VllmServer, gate: dict[str, object]) -> tuple[ScoringHooks, CollectorRegistry]:
    cfg = ScoringConfig(
        enabled=True,
        tokenizer={"model_dir": str(server.model_dir)},
        vllm={"base_url": server.base_url, "base_model": server.base_model, "max_concurrency": 4},
        tree={"alpha": 0.1, "max_depth_tokens": 12, "gate": gate},
    )
    registry = CollectorRegistry()
    return ScoringHooks.from_config(cfg, registry), registry


async def _outcomes(hooks: ScoringHooks) -> list[dict[str, Any]]:
    await hooks.start()
    try:
        return [
            cast(
                dict[str, Any],
                await _resolve(hooks.on_user_message(TurnContext("user_message", f"g{i}", 1, msgs, "a", None))),
            )
            for i, msgs in enumerate(_turns())
        ]
    finally:
        await hooks.stop()


async def test_the_gate_skips_trees_on_confident_turns_and_grows_them_on_uncertain_ones(
    vllm_server: VllmServer,
) -> None:
    reference, _ = _hooks(vllm_server, {"mode": "off"})
    full = await _outcomes(reference)
    gated_hooks, registry = _hooks(
        vllm_server, {"mode": "cheap_signal", "min_signals": 6, "window": 20, "grow_share": 0.4}
    )
    gated = await _outcomes(gated_hooks)
    decisions = [o["gate"] for o in gated]
    assert decisions[:6] == ["grown_warming_up"] * 6
    assert {"grown_uncertain", "skipped_confident"} <= set(decisions[6:]), decisions
    for g, f in zip(gated, full, strict=True):
        assert "error" not in g and "error" not in f
        if g["grown"]:
            # The same tree as without the gate (the probe is its first request, nothing redone).
            for key in ("leaves", "complete_leaves", "generated_tokens", "distinct_tokens"):
                assert g[key] == f[key], key
            assert g["max_logprob"] == pytest.approx(f["max_logprob"], abs=1e-3)
            assert g["requests"] == f["requests"]
        else:
            assert g["requests"] == 1 and g["generated_tokens"] <= f["generated_tokens"]
            if g["max_logprob"] is not None:
                # The greedy branch is one of the full tree's complete branches: a lower bound.
                assert f["max_logprob"] >= g["max_logprob"] - 1e-3
    # Work saved where the gate said so, and the metric says as much.
    assert sum(g["requests"] for g in gated) < sum(f["requests"] for f in full)
    for d in ("grown_uncertain", "grown_warming_up", "skipped_confident"):
        assert registry.get_sample_value("sidecar_tree_gate_total", {"agent": "a", "decision": d}) == decisions.count(d)
