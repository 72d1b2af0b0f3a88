"""Response-tree expansion logic on the in-process toy model (fast; the real-vLLM proof is in
``test_vllm_scoring.py``)."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.scoring.config import TreeConfig
from sidecar.scoring.tree import TreeBudget, TreeExpander, most_probable_text
from tests.scoring.fakes import ToyLM, brute_force_tree

STOP = (0,)


def _expander(lm: ToyLM, alpha: float, depth: int = 8, **budget: int) -> TreeExpander:
    return TreeExpander(lm, alpha=alpha, budget=TreeBudget(max_depth_tokens=depth, **budget), stop_token_ids=STOP)


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    alpha=st.sampled_from([0.05, 0.1, 0.2, 0.3]),
    depth=st.integers(1, 9),
    prompt=st.lists(st.integers(1, 11), min_size=1, max_size=4),
)
async def test_fast_expansion_equals_brute_force(seed: int, alpha: float, depth: int, prompt: list[int]) -> None:
    lm = ToyLM(seed=seed)
    tree = await _expander(lm, alpha, depth, max_generated_tokens=100_000, max_requests=100_000).expand("m", prompt)
    leaves, best, leaf_lps = await brute_force_tree(
        ToyLM(seed=seed), "m", prompt, alpha=alpha, top_k=tree.top_k, depth=depth, stop_ids=STOP
    )
    assert tree.budget_hit is None
    assert tree.leaves == leaves
    assert sorted(b.logprob for b in tree.branches) == pytest.approx(leaf_lps, abs=1e-9)
    if best is None:
        assert tree.max_logprob is None
    else:
        assert tree.max_logprob == pytest.approx(best, abs=1e-9)
    # Each tree token generated once: nothing beyond the distinct tokens (forced tokens are prompt).
    assert tree.generated_tokens <= tree.distinct_tokens
    assert tree.distinct_tokens - tree.generated_tokens == tree.leaves - 1


def test_k_is_min_of_max_logprobs_and_ceil_inverse_alpha() -> None:
    assert _expander(ToyLM(max_logprobs=20), 0.1).top_k == 10
    assert _expander(ToyLM(max_logprobs=20), 0.3).top_k == 4
    assert _expander(ToyLM(max_logprobs=20), 0.01).top_k == 20
    assert _expander(ToyLM(max_logprobs=5), 0.05).top_k == 5
    assert TreeConfig(alpha=0.2).top_k(20) == 5


async def test_every_branch_point_has_path_probability_at_least_alpha() -> None:
    lm = ToyLM(seed=3, peak=1.0)
    tree = await _expander(lm, 0.05, depth=6, max_generated_tokens=10_000, max_requests=10_000).expand("m", [1, 2])
    assert tree.leaves > 3
    for b in tree.branches[1:]:
        # The branch's logprob at its split, i.e. up to and including its forced token.
        parent = tree.branches[b.parent or 0]
        assert b.tokens[: b.split] == parent.tokens[: b.split]
        split_lp = _path_lp(lm, [1, 2], b.tokens[: b.split + 1])
        assert split_lp >= math.log(0.05) - 1e-12


def _path_lp(lm: ToyLM, prompt: list[int], toks: list[int]) -> float:
    total = 0.0
    for i, t in enumerate(toks):
        total += lm.dist(prompt + toks[:i])[t]
    return total


async def test_token_budget_truncates_and_flags() -> None:
    lm = ToyLM(seed=5, peak=1.0)
    tree = await _expander(lm, 0.05, depth=8, max_generated_tokens=12).expand("m", [3])
    assert lm.generated <= 12
    assert tree.budget_hit == "tokens"
    assert any(b.truncated == "budget" for b in tree.branches)


async def test_request_budget_truncates_and_flags() -> None:
    lm = ToyLM(seed=5, peak=1.0)
    tree = await _expander(lm, 0.05, depth=8, max_requests=1).expand("m", [3])
    assert len(lm.requests) == 1
    assert tree.requests == 1
    assert tree.budget_hit == "requests"


async def test_leaf_budget_caps_branches() -> None:
    lm = ToyLM(seed=5, peak=0.5)
    tree = await _expander(lm, 0.02, depth=8, max_leaves=4).expand("m", [3])
    assert tree.leaves == 4
    assert tree.budget_hit == "leaves"


async def test_branches_of_one_level_are_batched() -> None:
    lm = ToyLM(seed=11, peak=1.0)
    tree = await _expander(lm, 0.05, depth=1).expand("m", [4])
    # Depth 1: the root request, and every alternative of the first token ends at once (depth).
    assert len(lm.requests) == 1
    assert tree.leaves == 1 + sum(1 for b in tree.branches if b.parent == 0)


async def test_stop_strings_end_a_branch_at_the_completing_token() -> None:
    lm = ToyLM(seed=2)
    text = {i: chr(ord("a") + i) for i in range(12)}

    def decode(ids: object) -> str:
        return "".join(text[i] for i in ids)  # type: ignore[attr-defined]

    free = await _expander(lm, 0.5, depth=8).expand("m", [1])
    root = free.branches[0].tokens
    assert len(root) >= 3
    stop = decode(root[1:3])
    expander = TreeExpander(
        ToyLM(seed=2), alpha=0.5, budget=TreeBudget(max_depth_tokens=8), stop_token_ids=STOP,
        stop_strings=[stop], decode=decode,
    )  # fmt: skip
    tree = await expander.expand("m", [1])
    first = tree.branches[0]
    assert first.complete
    assert decode(first.tokens).endswith(stop)
    assert stop not in decode(first.tokens[:-1])


async def test_serialisation_is_json_and_numbers_only() -> None:
    lm = ToyLM(seed=8, peak=1.0)
    tree = await _expander(lm, 0.1, depth=6).expand("m", [2])
    data = json.loads(json.dumps(tree.to_json()))
    assert data["leaves"] == tree.leaves == len(data["branches"])
    assert data["distinct_tokens"] == sum(len(b["tokens"]) for b in data["branches"])
    assert set(tree.stats()) <= set(data)
    text = most_probable_text(tree, lambda ids: " ".join(map(str, ids)), STOP)
    best = tree.best_branch()
    assert (best is None and text == "") or (best is not None and text.split() == [str(t) for t in best.tokens[:-1]])


def test_alpha_outside_unit_interval_is_refused() -> None:
    with pytest.raises(ValueError, match="alpha"):
        _expander(ToyLM(), 1.0)
    with pytest.raises(ValueError, match="alpha"):
        _expander(ToyLM(), 0.0)
