"""The tree gate on the toy model: the probe is the tree's first request, a grown tree is the same
tree, a gated one stops after the probe, and the decisions follow the agent's window (the real-vLLM
proof is in ``test_gate_vllm.py``)."""

from __future__ import annotations

import inspect
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry
from pydantic import ValidationError

from sidecar.contract import HookResult, Outcome, TurnContext
from sidecar.scoring.config import ScoringConfig, TreeConfig, TreeGateConfig
from sidecar.scoring.gate import DECISIONS, TreeGate, probe_signal
from sidecar.scoring.hooks import ScoringHooks
from sidecar.scoring.tree import Branch, ResponseTree, TreeBudget, TreeExpander
from tests.scoring.conversations import RESTAURANT, TRAVEL
from tests.scoring.fakes import ToyLM
from tests.support.tiny_model import build_tokenizer

STOP = (0,)


def _expander(lm: ToyLM, alpha: float, depth: int) -> TreeExpander:
    budget = TreeBudget(max_depth_tokens=depth, max_generated_tokens=100_000, max_requests=100_000)
    return TreeExpander(lm, alpha=alpha, budget=budget, stop_token_ids=STOP)


def _shape(tree: ResponseTree) -> list[tuple[tuple[int, ...], float, bool, str | None]]:
    return sorted((tuple(b.tokens), round(b.logprob, 9), b.complete, b.truncated) for b in tree.branches)


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    alpha=st.sampled_from([0.05, 0.1, 0.2]),
    depth=st.integers(1, 9),
    probe=st.one_of(st.none(), st.integers(1, 12)),
    prompt=st.lists(st.integers(1, 11), min_size=1, max_size=4),
)
async def test_a_grown_tree_is_the_tree_without_a_gate(
    seed: int, alpha: float, depth: int, probe: int | None, prompt: list[int]
) -> None:
    plain_lm, gated_lm = ToyLM(seed=seed, peak=1.2), ToyLM(seed=seed, peak=1.2)
    plain = await _expander(plain_lm, alpha, depth).expand("m", prompt)
    seen: list[ResponseTree] = []

    def grow(t: ResponseTree) -> bool:
        seen.append(t)
        return True

    gated = await _expander(gated_lm, alpha, depth).expand("m", prompt, probe_tokens=probe, grow=grow)
    assert len(seen) == 1 and gated.grown
    assert _shape(gated) == _shape(plain)
    # Nothing generated twice: the probe's tokens are the tree's.
    assert gated.generated_tokens == plain.generated_tokens
    # The probe was the first request alone: the greedy branch from the root, on the bare prompt.
    first = probe if probe is not None and probe < depth else depth
    assert gated_lm.requests[0]["n"] == 1 and gated_lm.requests[0]["max_tokens"] == first
    if probe is None or probe >= depth or _root_ended_within(plain, probe):
        assert gated.requests == plain.requests
    # (Otherwise the root's continuation is a request of a later level, batched with the branches
    # of the same remaining depth: the count may differ either way.)


def _root_ended_within(tree: ResponseTree, n: int) -> bool:
    root = tree.branches[0]
    return root.complete and len(root.tokens) <= n


async def test_a_gated_tree_stops_after_the_probe() -> None:
    lm = ToyLM(seed=7, peak=1.0)
    tree = await _expander(lm, 0.05, 8).expand("m", [3, 4], grow=lambda t: False)
    assert not tree.grown
    assert tree.requests == 1 and len(lm.requests) == 1
    assert lm.requests[0]["max_tokens"] == 8
    # The alternatives the probe saw are recorded, cut by the gate; the root is the greedy branch.
    assert tree.leaves > 1, "this seed branches at alpha 0.05"
    assert all(b.truncated == "gate" for b in tree.branches[1:] if not b.complete)
    assert tree.stats()["grown"] is False
    full = await _expander(ToyLM(seed=7, peak=1.0), 0.05, 8).expand("m", [3, 4])
    assert tree.branches[0].tokens == full.branches[0].tokens
    assert tree.generated_tokens < full.generated_tokens


async def test_the_probe_length_is_capped_by_the_depth_and_continues_the_root() -> None:
    lm = ToyLM(seed=11, peak=3.0, end_ids=())  # no end: the root runs to the depth
    tree = await _expander(lm, 0.3, 6).expand("m", [1], probe_tokens=2, grow=lambda t: True)
    assert [r["max_tokens"] for r in lm.requests][:2] == [2, 4]
    assert len(tree.branches[0].tokens) == 6 and tree.branches[0].truncated == "depth"
    lm2 = ToyLM(seed=11, peak=3.0, end_ids=())
    await _expander(lm2, 0.3, 6).expand("m", [1], probe_tokens=50, grow=lambda t: False)
    assert lm2.requests[0]["max_tokens"] == 6


def test_the_signal_is_the_greedy_branch_logprob() -> None:
    tree = ResponseTree(alpha=0.1, top_k=10)
    tree.branches.append(Branch(tokens=[1, 2], logprob=-1.5, parent=None, split=0, complete=True))
    tree.branches.append(Branch(tokens=[1, 3], logprob=-2.0, parent=0, split=1))
    assert probe_signal(tree) == -1.5


def _gate(**kw: Any) -> TreeGate:
    return TreeGate(TreeGateConfig(mode="cheap_signal", **kw))


def test_every_tree_grows_while_warming_up() -> None:
    gate = _gate(min_signals=5, window=20, grow_share=0.2)
    decisions = [gate.decide("a", -0.1) for _ in range(5)]
    assert all(d.grow and d.decision == "grown_warming_up" and d.rank is None for d in decisions)
    # Another agent warms up on its own.
    assert gate.decide("b", -0.1).decision == "grown_warming_up"


def test_after_warm_up_only_the_lowest_share_grows() -> None:
    gate = _gate(min_signals=20, window=100, grow_share=0.25)
    for i in range(100):
        gate.decide("a", -float(i))  # signals 0 .. -99
    low, high, middle = gate.decide("a", -90.5), gate.decide("a", -3.0), gate.decide("a", -50.0)
    assert low.grow and low.decision == "grown_uncertain" and low.rank is not None and low.rank < 0.25
    assert not high.grow and high.decision == "skipped_confident"
    assert not middle.grow
    assert {low.decision, high.decision} <= set(DECISIONS)


def test_the_grow_share_is_kept_on_stationary_traffic() -> None:
    import random

    rng = random.Random(0)
    gate = _gate(min_signals=50, window=300, grow_share=0.3)
    grown = [gate.decide("a", rng.gauss(-8, 3)).grow for _ in range(3000)][300:]
    assert 0.25 < sum(grown) / len(grown) < 0.35


def test_the_window_is_bounded_and_forgets() -> None:
    gate = _gate(min_signals=20, window=20, grow_share=0.5)
    for _ in range(20):
        gate.decide("a", -100.0)
    for _ in range(20):
        gate.decide("a", -1.0)  # the old low signals are gone
    assert len(gate._agents["a"]) == 20
    assert gate.decide("a", -1.0).rank == pytest.approx(0.5)
    assert gate.decide("a", -50.0).grow


@pytest.mark.parametrize("bad", [math.nan, -math.inf])
def test_a_non_finite_signal_grows_and_stays_out_of_the_window(bad: float) -> None:
    gate = _gate(min_signals=20, window=20)
    for _ in range(20):
        gate.decide("a", -1.0)
    d = gate.decide("a", bad)
    assert d.grow and d.decision == "grown_uncertain"
    assert len(gate._agents["a"]) == 20 and math.isfinite(sum(gate._agents["a"]._sorted))


@pytest.mark.parametrize(
    "bad",
    [
        {"mode": "always"},
        {"grow_share": 0},
        {"grow_share": 1.5},
        {"grow_share": math.nan},
        {"probe_tokens": 0},
        {"probe_tokens": 10**6},
        {"window": 5},
        {"window": 10**9},
        {"min_signals": 0},
        {"min_signals": 600, "window": 500},
        {"threshold": -3.0},
        {"grow_share": "a lot"},
    ],
)
def test_config_refuses_bad_values(bad: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        TreeGateConfig(**bad)


def test_config_defaults_and_env_shape() -> None:
    cfg = TreeConfig()
    assert cfg.gate.mode == "off" and cfg.gate.probe_tokens is None
    assert TreeGate(cfg.gate).enabled is False
    on = ScoringConfig(tree={"gate": {"mode": "cheap_signal", "grow_share": 0.4}})
    assert on.tree.gate.grow_share == 0.4


# -- the live hooks ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("tok")
    build_tokenizer(d)
    return d


async def run(result: HookResult) -> Outcome:
    return await result if inspect.isawaitable(result) else result


def _hooks(tok_dir: Path, gate: dict[str, Any]) -> tuple[ScoringHooks, ToyLM, CollectorRegistry]:
    cfg = ScoringConfig(
        enabled=True,
        tokenizer={"model_dir": str(tok_dir)},
        tree={"alpha": 0.05, "max_depth_tokens": 6, "gate": gate},
    )
    lm = ToyLM(vocab=512, seed=1, peak=1.0)
    registry = CollectorRegistry()
    return ScoringHooks.from_config(cfg, registry, client=lm), lm, registry


def _ctx(messages: Any, cid: str) -> TurnContext:
    return TurnContext("user_message", cid, 2, messages, "booking", None)


async def test_hooks_count_decisions_and_gated_trees_cost_one_request(tok_dir: Path) -> None:
    hooks, lm, registry = _hooks(tok_dir, {"mode": "cheap_signal", "min_signals": 20, "window": 40, "grow_share": 0.3})
    outs = []
    for i in range(60):
        before = len(lm.requests)
        out = await run(hooks.on_user_message(_ctx(TRAVEL if i % 2 else RESTAURANT, f"c{i}")))
        outs.append((out, len(lm.requests) - before))
    decisions = [o["gate"] for o, _ in outs]
    assert decisions[:20] == ["grown_warming_up"] * 20
    assert "skipped_confident" in decisions[20:]
    for out, requests in outs:
        assert out["grown"] == (out["gate"] != "skipped_confident")
        if not out["grown"]:
            assert requests == 1 and out["requests"] == 1
    for d in DECISIONS:
        value = registry.get_sample_value("sidecar_tree_gate_total", {"agent": "booking", "decision": d}) or 0
        assert value == decisions.count(d)


async def test_hooks_without_the_gate_grow_every_tree_and_say_nothing_of_it(tok_dir: Path) -> None:
    hooks, _, registry = _hooks(tok_dir, {"mode": "off"})
    out = await run(hooks.on_user_message(_ctx(TRAVEL, "c")))
    assert out["grown"] is True and "gate" not in out
    assert (
        registry.get_sample_value("sidecar_tree_gate_total", {"agent": "booking", "decision": "grown_uncertain"})
        is None
    )
