"""Drift of live final verdicts from an adapter's validation baseline (``sidecar/scoring/drift.py``)."""

from __future__ import annotations

import inspect
import json
import math
import random
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry
from pydantic import ValidationError

from adapters.onboarding.baseline import drift_baseline, quantiles
from sidecar.contract import HookResult, Outcome, TurnContext
from sidecar.scoring.config import AgentConfig, DriftBaselineConfig, DriftConfig, ScoringConfig
from sidecar.scoring.drift import DriftTracker, DriftWindow, baseline_cdf, ks_distance, resolve_baseline
from sidecar.scoring.hooks import ScoringHooks
from sidecar.transcript.model import Message
from tests.scoring.fakes import ToyLM
from tests.support.tiny_model import build_tokenizer

UNIFORM = tuple(i / 20 for i in range(21))


def _sample(n: int, seed: int, lo: float = 0.0, hi: float = 1.0) -> list[float]:
    rng = random.Random(seed)
    return [lo + (hi - lo) * rng.random() for _ in range(n)]


# -- the statistic -------------------------------------------------------------------------------


def test_baseline_cdf_interpolates_quantiles_and_handles_atoms() -> None:
    assert baseline_cdf(-1.0, UNIFORM) == 0.0
    assert baseline_cdf(2.0, UNIFORM) == 1.0
    assert baseline_cdf(0.33, UNIFORM) == pytest.approx(0.33)
    atom = (0.0, 0.5, 0.5, 1.0)  # a third of the mass sits on 0.5
    assert baseline_cdf(0.5, atom, left=True) == pytest.approx(1 / 3)
    assert baseline_cdf(0.5, atom) == pytest.approx(2 / 3)


def test_identical_distributions_are_close_and_shifted_ones_far() -> None:
    same = ks_distance(_sample(2000, 1), UNIFORM)
    assert same < 0.05
    shifted = ks_distance(_sample(2000, 2, 0.3, 1.0), UNIFORM)
    assert shifted == pytest.approx(0.3, abs=0.05)
    disjoint = ks_distance(_sample(200, 3, 0.9, 1.0), quantiles(_sample(200, 4, 0.0, 0.1)))
    assert disjoint == 1.0


def test_ks_distance_is_exact_on_a_point_mass() -> None:
    # All verdicts at 0.25 against uniform: F jumps 0 -> 1 at 0.25, the uniform CDF is 0.25 there.
    assert ks_distance([0.25] * 10, UNIFORM) == pytest.approx(0.75)
    # Baseline with all mass at 0.7 (tied quantiles) against the same point: 0.
    assert ks_distance([0.7] * 5, (0.7, 0.7, 0.7)) == 0.0


@given(
    st.lists(st.floats(0, 1), min_size=1, max_size=60),
    st.lists(st.floats(0, 1), min_size=2, max_size=30),
)
def test_ks_distance_is_a_share(sample: list[float], qs: list[float]) -> None:
    d = ks_distance(sample, sorted(qs))
    assert 0.0 <= d <= 1.0
    # Against its own quantiles a sample is never far: linear interpolation moves each step by < 1/n.
    assert ks_distance(sample, quantiles(sample, 101)) <= 1.0 / len(sample) + 0.011


def test_window_is_bounded_and_refuses_values_that_are_no_probability() -> None:
    w = DriftWindow(8)
    for hostile, reason in [
        (math.nan, "not_finite"),
        (math.inf, "not_finite"),
        (-math.inf, "not_finite"),
        (1.5, "out_of_range"),
        (-1e-9, "out_of_range"),
        (True, "not_finite"),
        ("0.5", "not_finite"),
    ]:
        assert w.add(hostile, complete=True, untrusted=False) == reason  # type: ignore[arg-type]
    assert len(w) == 0
    assert w.distances(DriftBaselineConfig(completion_rate=0.5, p_end_quantiles=UNIFORM)) == {}  # empty window
    for i in range(100):
        assert w.add(i / 100, complete=i % 2 == 0, untrusted=True) is None
    assert len(w) == 8
    d = w.distances(DriftBaselineConfig(completion_rate=0.5, untrusted_share=0.0, p_end_quantiles=UNIFORM))
    assert d["completion_rate"] == 0.0
    assert d["untrusted_share"] == 1.0
    assert d["p_end"] == pytest.approx(0.92)  # every value in (0.92, 0.99]


@pytest.mark.parametrize(
    "bad",
    [
        {"p_end_quantiles": [0.5]},
        {"p_end_quantiles": [0.6, 0.5]},
        {"p_end_quantiles": [0.0, 1.5]},
        {"p_end_quantiles": [0.0, math.nan]},
        {"p_end_quantiles": [i / 200 for i in range(201)]},
        {"completion_rate": 1.1},
        {"completion_rate": math.inf},
        {"untrusted_share": -0.1},
        {"completion_rate": 0.5, "extra": 1},
    ],
)
def test_malformed_baselines_are_refused(bad: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        DriftBaselineConfig.model_validate(bad)


def test_min_verdicts_must_fit_the_window() -> None:
    with pytest.raises(ValidationError):
        DriftConfig(window_verdicts=10, min_verdicts=11)


# -- baselines from manifests --------------------------------------------------------------------


def _manifest(tmp_path: Path, validation: Any) -> Path:
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps({"kind": "exported-lora-adapter", "validation": validation}))
    return path


def test_onboarding_baseline_is_what_the_sidecar_reads(tmp_path: Path) -> None:
    validation = {
        "rule": "threshold",
        "p_end_threshold": 0.5,
        "trusted": True,
        "p_end": {"complete": [0.2, 0.6, 0.7, 0.9], "incomplete": [0.01, 0.1]},
        "after": {"greedy": {"complete": {"recall": 0.25}}},
    }
    written = drift_baseline(validation)
    assert written["completion_rate"] == 0.75
    assert written["p_end_quantiles"][0] == 0.2 and written["p_end_quantiles"][-1] == 0.9
    agent = AgentConfig(adapter="shop-1", adapter_manifest=_manifest(tmp_path, {"baseline": written}))
    baseline, where = resolve_baseline(agent)
    assert where == "manifest"
    assert baseline == DriftBaselineConfig.model_validate(written)
    assert drift_baseline({**validation, "rule": "greedy"})["completion_rate"] == 0.25
    # Configured baselines win over the manifest.
    configured = AgentConfig(
        adapter="shop-1", adapter_manifest=agent.adapter_manifest, baseline=DriftBaselineConfig(completion_rate=0.1)
    )
    assert resolve_baseline(configured) == (DriftBaselineConfig(completion_rate=0.1), "config")


@pytest.mark.parametrize(
    "content",
    [
        "not json",
        "[" * 100_000,
        json.dumps({"validation": {"baseline": {"p_end_quantiles": [0.9, 0.1]}}}),
        json.dumps({"validation": {"baseline": {"p_end_quantiles": "0.1,0.9"}}}),
        json.dumps({"validation": {"baseline": {"completion_rate": "NaN"}}}),
        json.dumps({"validation": {"baseline": [1, 2]}}),
        json.dumps({"validation": {"f1_complete": 0.9}}),
        json.dumps({"validation": []}),
        json.dumps({"validation": {"baseline": {"p_end_quantiles": [0.5] * 2_000_000}}}),
    ],
)
def test_hostile_manifests_give_no_baseline(tmp_path: Path, content: str) -> None:
    path = tmp_path / "manifest.json"
    path.write_text(content)
    baseline, why = resolve_baseline(AgentConfig(adapter="a", adapter_manifest=path))
    assert baseline is None
    assert why


def test_tracker_exports_after_min_verdicts_and_counts_rejections() -> None:
    registry = CollectorRegistry()
    tracker = DriftTracker(DriftConfig(window_verdicts=16, min_verdicts=4), registry)
    agent = AgentConfig(adapter="a", baseline=DriftBaselineConfig(completion_rate=1.0, p_end_quantiles=UNIFORM))
    plain = AgentConfig()

    def drift(label: str, signal: str) -> float | None:
        return registry.get_sample_value("sidecar_adapter_drift", {"agent": label, "signal": signal})

    for i in range(3):
        tracker.observe("a", agent, p_end=0.05 * i, complete=False, untrusted=False)
        tracker.observe("b", plain, p_end=0.5, complete=False, untrusted=False)  # no baseline: untracked
    assert drift("a", "completion_rate") is None
    tracker.observe("a", agent, p_end=math.nan, complete=False, untrusted=False)
    tracker.observe("a", agent, p_end=7.0, complete=False, untrusted=False)
    assert (
        registry.get_sample_value("sidecar_adapter_drift_rejected_total", {"agent": "a", "reason": "not_finite"}) == 1
    )
    assert (
        registry.get_sample_value("sidecar_adapter_drift_rejected_total", {"agent": "a", "reason": "out_of_range"}) == 1
    )
    tracker.observe("a", agent, p_end=0.15, complete=False, untrusted=False)
    assert registry.get_sample_value("sidecar_adapter_drift_window_verdicts", {"agent": "a"}) == 4
    assert drift("a", "completion_rate") == 1.0
    assert drift("a", "p_end") == pytest.approx(0.85)  # F is 1 at 0.15, the uniform 0.15
    assert drift("a", "untrusted_share") is None  # not in the baseline
    assert registry.get_sample_value("sidecar_adapter_drift_window_verdicts", {"agent": "b"}) is None
    off = DriftTracker(DriftConfig(enabled=False), CollectorRegistry())
    off.observe("a", agent, p_end=0.5, complete=True, untrusted=False)
    assert off.metrics.window.labels("a")._value.get() == 0


# -- live: another agent's conversations replayed under an agent's name -------------------------


_CITY = ["Cambridge", "Ely", "Oxford", "York", "Bath", "Leeds"]
_TIME = ["6pm", "7pm", "half past eight", "noon", "9:15"]
_THANKS = ["Thanks, goodbye!", "Perfect, that is all.", "Great, bye.", "Lovely, thank you."]


def _restaurant(rng: random.Random) -> list[Message]:
    people, city, time = rng.randint(1, 9), rng.choice(_CITY), rng.choice(_TIME)
    return [
        Message("user", f"Find me a restaurant in {city} for {people} at {time}."),
        Message("assistant", f"The {rng.choice(_CITY)} Grill restaurant has a table for {people} at {time}."),
        Message("user", f"Book it, reference under {rng.choice(['Ann', 'Bo', 'Cy', 'Di'])}. {rng.choice(_THANKS)}"),
        Message("assistant", f"Booked, reference {rng.randint(1000, 9999)}. Enjoy the restaurant!"),
    ]


def _it_support(rng: random.Random) -> list[Message]:
    n = rng.randint(2, 99)
    return [
        Message("user", f"My laptop {n} cannot reach the VPN since the update."),
        Message("assistant", f"Which client version does laptop {n} show?"),
        Message("user", f"Version 4.{rng.randint(0, 9)}, and the printer on floor {rng.randint(1, 7)} fails too."),
        Message("assistant", f"Try reinstalling; ticket {rng.randint(1000, 9999)} is open for the printer."),
    ]


class DomainAdapterLM(ToyLM):
    """A fake adapter fit to one agent: P(end) is high on conversations of its domain (they mention
    ``marker``), low on others, with some spread from the context hash (a trained adapter's noise)."""

    def __init__(self) -> None:
        super().__init__(vocab=512, seed=1, peak=1.5)
        self.marker: list[int] = []  # set once the scorers' tokenizer is known
        self.end_id = 0

    def dist(self, context: Any) -> dict[int, float]:
        d = super().dist(context)
        ctx, m = list(context), self.marker
        own = any(ctx[i : i + len(m)] == m for i in range(len(ctx) - len(m) + 1))
        u = math.exp(d[1])  # a context-dependent number in (0, 1)
        u = u / (u + math.exp(d[2]))
        p = 0.55 + 0.4 * u if own else 0.005 + 0.1 * u
        rest = 1.0 - math.exp(d[self.end_id])
        return {t: math.log(p) if t == self.end_id else lp + math.log((1 - p) / rest) for t, lp in d.items()}


async def _run(result: HookResult) -> Outcome:
    return await result if inspect.isawaitable(result) else result


def _hooks(tok_dir: Path, registry: CollectorRegistry, baseline: dict[str, Any] | None) -> ScoringHooks:
    agent: dict[str, Any] = {"adapter": "shop-1", "validation_f1": 0.9}
    if baseline is not None:
        agent["baseline"] = baseline
    cfg = ScoringConfig.model_validate(
        {
            "enabled": True,
            "tokenizer": {"model_dir": str(tok_dir)},
            "agents": {"shop": agent},
            "drift": {"window_verdicts": 64, "min_verdicts": 20},
        }
    )
    lm = DomainAdapterLM()
    hooks = ScoringHooks.from_config(cfg, registry, client=lm)
    lm.marker = hooks.scorers.tokenizer.encode_untrusted(" restaurant")
    assert hooks.scorers.end_id is not None and lm.marker
    lm.end_id = hooks.scorers.end_id
    return hooks


async def _end(hooks: ScoringHooks, conversations: list[list[Message]], prefix: str) -> list[Outcome]:
    out = []
    for i, messages in enumerate(conversations):
        ctx = TurnContext("conversation_ended", f"{prefix}-{i}", 2, messages, "shop", None)
        out.append(await _run(hooks.on_conversation_ended(ctx)))
    return out


async def test_another_agents_conversations_under_an_agents_name_raise_drift(tmp_path: Path) -> None:
    build_tokenizer(tmp_path)
    rng = random.Random(7)
    held_back = [_restaurant(rng) for _ in range(60)]
    own = [_restaurant(rng) for _ in range(64)]
    foreign = [_it_support(rng) for _ in range(64)]

    # The validation: the adapter's final verdicts on the agent's held-back conversations.
    validated = await _end(_hooks(tmp_path, CollectorRegistry(), None), held_back, "v")
    assert all("error" not in o for o in validated)
    baseline = {
        "p_end_quantiles": quantiles([float(o["p_end"]) for o in validated]),  # type: ignore[arg-type]
        "completion_rate": sum(o["complete"] is True for o in validated) / len(validated),
        "untrusted_share": 0.0,
    }

    def drift(registry: CollectorRegistry, signal: str) -> float:
        value = registry.get_sample_value("sidecar_adapter_drift", {"agent": "shop", "signal": signal})
        assert value is not None
        return value

    same = CollectorRegistry()
    await _end(_hooks(tmp_path, same, baseline), own, "o")
    replayed = CollectorRegistry()
    await _end(_hooks(tmp_path, replayed, baseline), foreign, "f")
    assert same.get_sample_value("sidecar_adapter_drift_window_verdicts", {"agent": "shop"}) == 64
    assert drift(same, "p_end") < 0.3
    assert drift(replayed, "p_end") > 0.9
    assert drift(same, "completion_rate") < 0.15
    assert drift(replayed, "completion_rate") > 0.4  # the greedy rule still ends some (a flat rest)
    assert drift(same, "untrusted_share") == drift(replayed, "untrusted_share") == 0.0
