"""Which agents have a trustworthy completion adapter, and the threshold rule, on the toy model."""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from pydantic import ValidationError

from sidecar.contract import HookResult, Outcome, TurnContext
from sidecar.scoring.completion import CompletionScore, with_threshold
from sidecar.scoring.config import AgentConfig, ScoringConfig
from sidecar.scoring.hooks import ScoringHooks
from sidecar.scoring.trust import AdapterTrust, assess, manifest_f1
from tests.scoring.conversations import RESTAURANT
from tests.scoring.fakes import ToyLM
from tests.support.tiny_model import build_tokenizer


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("tok")
    build_tokenizer(d)
    return d


def _manifest(tmp_path: Path, f1: Any) -> Path:
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps({"kind": "exported-lora-adapter", "validation": {"f1_complete": f1}}))
    return path


def test_assessment_of_each_kind_of_route(tmp_path: Path) -> None:
    assert assess(AgentConfig(), 0.8).source == "instruct"
    assert assess(AgentConfig(adapter="a"), 0.8).source == "unvalidated_adapter"
    low = assess(AgentConfig(adapter="a", validation_f1=0.62), 0.8)
    assert (low.source, low.trusted) == ("untrusted_adapter", False)
    assert "0.620 < 0.800" in low.reason
    ok = assess(AgentConfig(adapter="a", validation_f1=0.93), 0.8)
    assert (ok.source, ok.trusted) == ("adapter", True)
    from_manifest = assess(AgentConfig(adapter="a", adapter_manifest=_manifest(tmp_path, 0.91)), 0.8)
    assert (from_manifest.source, from_manifest.validation_f1) == ("adapter", 0.91)
    # The config's own figure wins over the manifest's.
    assert assess(AgentConfig(adapter="a", validation_f1=0.5, adapter_manifest=tmp_path), 0.8).source == (
        "untrusted_adapter"
    )


@pytest.mark.parametrize(
    "content",
    [
        "{not json",
        json.dumps([1]),
        json.dumps({"validation": {"f1_complete": True}}),
        json.dumps({"validation": {"f1_complete": 7}}),
        json.dumps({}),
    ],
)
def test_a_bad_manifest_never_makes_an_adapter_trusted(tmp_path: Path, content: str) -> None:
    path = tmp_path / "manifest.json"
    path.write_text(content)
    f1, why = manifest_f1(path)
    assert f1 is None and why
    assert assess(AgentConfig(adapter="a", adapter_manifest=path), 0.0).source == "unvalidated_adapter"
    assert manifest_f1(tmp_path / "missing.json")[0] is None


def test_the_bundled_demo_adapter_is_worded_as_what_it_is_on_readyz() -> None:
    """The committed adapter's manifest says it is a demo adapter; readiness words it so, not as untrustworthy."""
    bundled = Path(__file__).resolve().parents[2] / "adapters" / "artifacts" / "completion" / "manifest.json"
    cfg = ScoringConfig(default_agent=AgentConfig(adapter="completion", adapter_manifest=bundled))
    detail = AdapterTrust(cfg, lambda *_: None).health().detail
    assert detail.startswith("not validated on this traffic: (other agents): unvalidated_adapter (demo adapter bundled")
    assert "no trustworthy adapter" not in detail


@pytest.mark.parametrize(
    ("note", "shown"),
    [
        ("for the booking agent", "for the booking agent"),
        ("\x1b[31mred\u202e" + "x" * 500, "[31mred" + "x" * 191),  # cut to 200, control characters dropped
        (42, None),
        ("  ", None),
    ],
)
def test_a_manifest_note_words_an_unvalidated_adapter(tmp_path: Path, note: object, shown: str | None) -> None:
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps({"kind": "exported-lora-adapter", "note": note}))
    route = assess(AgentConfig(adapter="a", adapter_manifest=path), 0.8)
    assert route.source == "unvalidated_adapter"
    expected = "no validation in the manifest" if shown is None else f"{shown}; no validation in the manifest"
    assert route.reason == expected


def test_threshold_rule_needs_an_adapter_and_a_threshold() -> None:
    with pytest.raises(ValidationError, match="threshold"):
        AgentConfig(adapter="a", completion_rule="threshold")
    with pytest.raises(ValidationError, match="threshold"):
        AgentConfig(completion_rule="threshold", p_end_threshold=0.2)
    with pytest.raises(ValidationError):
        AgentConfig(adapter="a", completion_rule="threshold", p_end_threshold=1.5)


def test_readiness_detail_names_untrusted_agents_and_never_gates() -> None:
    gauge: dict[str, float] = {}
    cfg = ScoringConfig(
        agents={
            "good": AgentConfig(adapter="g", validation_f1=0.95),
            "weak": AgentConfig(adapter="w", validation_f1=0.4),
            "bare": AgentConfig(),
        },
        default_agent=AgentConfig(adapter="bundled"),
    )
    trust = AdapterTrust(cfg, gauge.__setitem__)
    trust.publish_configured(lambda a: a or "default")
    assert gauge == {"good": 1.0, "weak": 0.0, "bare": 0.0, "default": 0.0}
    health = trust.health()
    assert health.ready is True
    assert "weak: untrusted_adapter" in health.detail and "bare: instruct" in health.detail
    assert "(other agents): unvalidated_adapter" in health.detail and "trusted: good" in health.detail
    assert trust.route("someone-new").adapter == "bundled"


def _score(p_end: float, greedy_end: bool) -> CompletionScore:
    return CompletionScore(
        "adapter", p_end, -1.0, greedy_end, True, () if greedy_end else (5, 6), "" if greedy_end else "left", 1, 1
    )


def test_threshold_rule_keeps_p_end_exact_and_the_greedy_verdict() -> None:
    below = with_threshold(_score(0.3, greedy_end=True), 0.4)
    assert (below.complete, below.p_end, below.greedy_complete) == (False, 0.3, True)
    above = with_threshold(_score(0.45, greedy_end=False), 0.4)
    assert (above.complete, above.remaining_text, above.greedy_complete) == (True, "", False)
    assert above.outcome(include_text=True)["greedy_complete"] is False
    assert "remaining_tasks" not in above.outcome(include_text=True)
    assert with_threshold(_score(0.4, greedy_end=False), 0.4).complete  # P(end) >= t


async def _run(result: HookResult) -> Outcome:
    return await result if inspect.isawaitable(result) else result


def _hooks(tok_dir: Path, agents: dict[str, Any]) -> tuple[ScoringHooks, CollectorRegistry]:
    registry = CollectorRegistry()
    cfg = ScoringConfig.model_validate({"enabled": True, "tokenizer": {"model_dir": str(tok_dir)}, "agents": agents})
    return ScoringHooks.from_config(cfg, registry, client=ToyLM(vocab=512, seed=1, peak=1.5)), registry


@pytest.mark.parametrize("threshold", [1e-9, 0.999999])
async def test_outcomes_name_the_source_adapter_and_rule(tok_dir: Path, threshold: float) -> None:
    agents = {
        "shop": {
            "adapter": "shop-1",
            "validation_f1": 0.9,
            "completion_rule": "threshold",
            "p_end_threshold": threshold,
        },
        "old": {"adapter": "bundled"},
    }
    hooks, registry = _hooks(tok_dir, agents)
    ctx = TurnContext("turn_closed", "c1", 2, RESTAURANT, "shop", None)
    out = await _run(hooks.on_turn_closed(ctx))
    assert (out["completion_source"], out["adapter"], out["completion_rule"]) == ("adapter", "shop-1", "threshold")
    assert out["complete"] is (threshold < 0.5)  # the toy model's P(end) lies between the two thresholds
    assert isinstance(out["greedy_complete"], bool)
    ended = await _run(hooks.on_conversation_ended(TurnContext("conversation_ended", "c1", 2, RESTAURANT, "old", None)))
    assert (ended["completion_source"], ended["adapter"], ended["completion_rule"]) == (
        "unvalidated_adapter",
        "bundled",
        "greedy",
    )
    instruct = await _run(hooks.on_turn_closed(TurnContext("turn_closed", "c2", 2, RESTAURANT, "other", None)))
    assert (instruct["completion_source"], instruct["adapter"]) == ("instruct", None)
    assert registry.get_sample_value("sidecar_completion_adapter_trusted", {"agent": "shop"}) == 1.0
    assert registry.get_sample_value("sidecar_completion_adapter_trusted", {"agent": "old"}) == 0.0
    assert registry.get_sample_value("sidecar_completion_adapter_trusted", {"agent": "other"}) == 0.0
