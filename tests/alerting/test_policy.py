"""The uncertainty policy: rates that track the target on any scale, ties handled, warm-up."""

from __future__ import annotations

import random
from typing import Literal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.alerting.config import UncertaintyPolicyConfig
from sidecar.alerting.policy import UncertaintyJudge


def rate(cfg: UncertaintyPolicyConfig, trees: list[tuple[int, float]], agent: str = "a") -> float:
    judge = UncertaintyJudge()
    flags = [judge.judge(cfg, agent, f"c{i}", leaves, lp).uncertain for i, (leaves, lp) in enumerate(trees)]
    scored = flags[cfg.min_trees :]
    return sum(scored) / len(scored)


@pytest.mark.parametrize("target", [0.02, 0.05, 0.1, 0.2])
@pytest.mark.parametrize("scale", [1.0, 100.0])
def test_flag_rate_tracks_the_target_whatever_the_model_scale(target: float, scale: float) -> None:
    rng = random.Random(7)
    trees = [(1 + int(rng.expovariate(0.5)), -scale * rng.expovariate(1.0)) for _ in range(4000)]
    cfg = UncertaintyPolicyConfig(target_rate=target, window_trees=500, min_trees=100)
    assert rate(cfg, trees) == pytest.approx(target, abs=0.02)


def test_degenerate_leaves_still_give_the_target_rate() -> None:
    """Most trees with one leaf (the bundled model): ties at the threshold are split by key."""
    rng = random.Random(3)
    trees = [(1 if rng.random() < 0.95 else 2, -rng.uniform(5, 30)) for _ in range(3000)]
    cfg = UncertaintyPolicyConfig(target_rate=0.05, window_trees=500, min_trees=100)
    assert rate(cfg, trees) == pytest.approx(0.05, abs=0.02)


def test_constant_trees_flag_the_target_share_not_all() -> None:
    cfg = UncertaintyPolicyConfig(target_rate=0.1, window_trees=200, min_trees=50)
    assert rate(cfg, [(1, -20.0)] * 1000) == pytest.approx(0.1, abs=0.04)


def test_top_on_both_is_what_is_flagged() -> None:
    cfg = UncertaintyPolicyConfig(target_rate=0.05, window_trees=300, min_trees=100, rule="min_rank")
    judge = UncertaintyJudge()
    rng = random.Random(1)
    for i in range(300):
        judge.judge(cfg, "a", f"w{i}", rng.randint(1, 5), -rng.uniform(1, 10))
    assert judge.judge(cfg, "a", "x", 50, -100.0).uncertain  # many leaves and a very low best branch
    assert not judge.judge(cfg, "a", "y", 50, -0.1).uncertain  # many leaves, but one branch is sure
    assert not judge.judge(cfg, "a", "z", 1, -100.0).uncertain  # one sure-of-itself path, however long


def test_nothing_is_flagged_while_warming_up_and_agents_are_separate() -> None:
    cfg = UncertaintyPolicyConfig(target_rate=0.5, window_trees=100, min_trees=20)
    judge = UncertaintyJudge()
    verdicts = [judge.judge(cfg, "a", f"k{i}", 99, -99.0) for i in range(20)]
    assert not any(v.uncertain for v in verdicts) and {v.rule for v in verdicts} == {"warming_up"}
    assert judge.judge(cfg, "b", "k", 99, -99.0).rule == "warming_up"


def test_fixed_mode_uses_the_thresholds() -> None:
    cfg = UncertaintyPolicyConfig(mode="fixed", min_leaves=4, max_best_logprob=-3.0)
    judge = UncertaintyJudge()
    assert judge.judge(cfg, "a", "k", 4, -0.1).uncertain
    assert judge.judge(cfg, "a", "k", 1, -3.5).uncertain
    assert not judge.judge(cfg, "a", "k", 3, -2.9).uncertain


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 300), st.floats(-1e6, 0.0)), min_size=1, max_size=200))
def test_scores_are_in_the_unit_interval_and_judging_never_raises(trees: list[tuple[int, float]]) -> None:
    cfg = UncertaintyPolicyConfig(target_rate=0.1, window_trees=50, min_trees=10)
    judge = UncertaintyJudge()
    for i, (leaves, lp) in enumerate(trees):
        v = judge.judge(cfg, "a", str(i), leaves, lp)
        assert v.score is None or 0.0 <= v.score <= 1.0
    assert judge.judge(cfg, "a", "none", 3, None).uncertain is False


def test_best_logprob_rule_ignores_the_leaf_count() -> None:
    """rule best_logprob: a one-leaf tree with the lowest best branch is flagged (min_rank would not:
    its leaf rank is low), and a many-leaf tree with a sure best branch is not."""
    rng = random.Random(1)
    window = [(rng.randint(1, 5), -rng.uniform(1, 10)) for _ in range(300)]
    rules: tuple[tuple[Literal["min_rank", "best_logprob"], bool], ...] = (("best_logprob", True), ("min_rank", False))
    for rule, expected in rules:
        cfg = UncertaintyPolicyConfig(target_rate=0.05, window_trees=300, min_trees=100, rule=rule)
        judge = UncertaintyJudge()
        for i, (leaves, lp) in enumerate(window):
            judge.judge(cfg, "a", f"w{i}", leaves, lp)
        assert judge.judge(cfg, "a", "x", 1, -100.0).uncertain is expected
        assert not judge.judge(cfg, "a", "y", 50, -0.1).uncertain


def test_best_logprob_rule_tracks_the_target_rate() -> None:
    rng = random.Random(5)
    trees = [(1 + int(rng.expovariate(0.5)), -rng.expovariate(1.0)) for _ in range(3000)]
    cfg = UncertaintyPolicyConfig(target_rate=0.05, window_trees=500, min_trees=100, rule="best_logprob")
    assert rate(cfg, trees) == pytest.approx(0.05, abs=0.02)


def test_the_default_rule_leaves_the_leaf_count_out() -> None:
    assert UncertaintyPolicyConfig().rule == "best_logprob"
