"""Scorers, the scorer factory, on the toy model: what it builds, how it routes, that it scores
what the live hooks score, and that it carries none of the live policy."""

from __future__ import annotations

import dataclasses
import inspect
import threading
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from sidecar.contract import HookResult, Outcome, TreeScored, TurnContext, events_of
from sidecar.errors import ConfigError, RetryableError
from sidecar.scoring.config import ScoringConfig
from sidecar.scoring.hooks import ScoringHooks
from sidecar.scoring.scorers import Scorers
from tests.scoring.conversations import RESTAURANT, TRAVEL
from tests.scoring.fakes import ToyLM
from tests.support.tiny_model import BOS, END_TAG, PAD, build_tokenizer


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("tok")
    build_tokenizer(d)
    return d


def _config(tok_dir: Path, **overrides: Any) -> ScoringConfig:
    base: dict[str, Any] = {
        "enabled": True,
        "tokenizer": {"model_dir": str(tok_dir)},
        "agents": {"booking": {"adapter": "completion-booking"}},
        "tree": {"alpha": 0.1, "max_depth_tokens": 6},
    }
    for k, v in overrides.items():
        base[k] = {**base[k], **v} if isinstance(v, dict) and v and isinstance(base.get(k), dict) else v
    return ScoringConfig.model_validate(base)


def _lm() -> ToyLM:
    return ToyLM(vocab=512, seed=1, peak=1.5)


async def _run(result: HookResult) -> Outcome:
    return await result if inspect.isawaitable(result) else result


def test_builds_the_tokenizer_prompts_scorers_tree_and_trust(tok_dir: Path) -> None:
    lm = _lm()
    scorers = Scorers(_config(tok_dir), lm)
    tok = scorers.tokenizer
    assert scorers.client is lm
    assert scorers.end_id == tok.token_id(END_TAG)
    assert scorers.end_id in scorers.stop_ids
    assert tok.token_id(BOS) not in scorers.stop_ids and tok.token_id(PAD) not in scorers.stop_ids
    assert scorers.adapter_scorer is not None
    assert scorers.instruct_scorer.variant == "instruct"
    assert scorers.tree.budget.max_depth_tokens == 6
    assert scorers.trust.route("booking").adapter == "completion-booking"
    assert scorers.trust.route(None).source == "instruct"
    assert scorers.tree_model("booking") == scorers.tree_model(None) == "base"


def test_the_tokenizer_is_required(tok_dir: Path) -> None:
    # (An enabled config without one does not validate; a disabled one still builds no scorer.)
    with pytest.raises(ConfigError, match="model_dir"):
        Scorers(_config(tok_dir, enabled=False, tokenizer={"model_dir": None}), _lm())


def test_without_the_end_tag_token_only_the_instruct_variant(tok_dir: Path) -> None:
    with pytest.raises(ConfigError, match="end tag"):
        Scorers(_config(tok_dir, completion={"end_tag": "<|no_such_token|>"}), _lm())
    scorers = Scorers(_config(tok_dir, completion={"end_tag": "<|no_such_token|>"}, agents={}), _lm())
    assert scorers.end_id is None and scorers.adapter_scorer is None


async def test_score_adapter_needs_the_end_tag(tok_dir: Path) -> None:
    scorers = Scorers(_config(tok_dir, completion={"end_tag": "<|no_such_token|>"}, agents={}), _lm())
    with pytest.raises(ConfigError, match="end tag"):
        await scorers.score_adapter(RESTAURANT, "completion-booking")


async def test_completion_requests_route_to_the_adapter_or_the_instruct_prompt(tok_dir: Path) -> None:
    scorers = Scorers(_config(tok_dir), _lm())
    adapter = await scorers.completion_request(RESTAURANT, "completion-booking")
    assert (adapter.scorer, adapter.model) == (scorers.adapter_scorer, "completion-booking")
    assert adapter.prompt == scorers.prompts.completion_adapter(RESTAURANT)[0]
    instruct = await scorers.completion_request(RESTAURANT, None)
    assert (instruct.scorer, instruct.model) == (scorers.instruct_scorer, "base")
    assert instruct.prompt == scorers.prompts.completion_instruct(RESTAURANT)[0]
    assert (await adapter.score()).variant == "adapter"
    assert (await instruct.score()).variant == "instruct"


async def test_offline_verdicts_are_the_live_verdicts(tok_dir: Path) -> None:
    """What offline tools read is what the hooks export for the same conversation."""
    cfg = _config(tok_dir)
    scorers = Scorers(cfg, _lm())
    hooks = ScoringHooks.from_config(cfg, CollectorRegistry(), client=_lm())
    live = await _run(hooks.on_turn_closed(TurnContext("turn_closed", "c", 4, RESTAURANT, "booking", None)))
    offline = await scorers.score_adapter(RESTAURANT, "completion-booking")
    assert offline.outcome(include_text=False).items() <= live.items()
    live_instruct = await _run(hooks.on_turn_closed(TurnContext("turn_closed", "d", 4, RESTAURANT, None, None)))
    offline_instruct = await (await scorers.completion_request(RESTAURANT, None)).score()
    assert offline_instruct.outcome(include_text=False).items() <= live_instruct.items()


async def test_offline_trees_are_the_live_trees(tok_dir: Path) -> None:
    cfg = _config(tok_dir)
    scorers = Scorers(cfg, _lm())
    hooks = ScoringHooks.from_config(cfg, CollectorRegistry(), client=_lm())
    out = await _run(hooks.on_user_message(TurnContext("user_message", "c", 3, TRAVEL, "booking", None)))
    live = next(e for e in events_of(out) if isinstance(e, TreeScored))
    request = await scorers.tree_request(TRAVEL, scorers.tree_model("booking"))
    tree = await request.expand()
    assert request.turns_dropped == out["turns_dropped"]
    # The live hooks add who judged (provenance) on top of the same tree; the tree itself is equal.
    assert live.provenance is not None
    assert live.provenance.rule == "response_tree"
    offline = scorers.tree_scored(tree, request.model, scorers.best_branch_text(tree))
    assert offline == dataclasses.replace(live, provenance=None)


async def test_no_live_policy_applies(tok_dir: Path) -> None:
    """Scoring off, nothing sampled, no token budget: an offline run still scores every item."""
    cfg = _config(
        tok_dir,
        enabled=False,
        completion={"enabled": False},
        tree={"enabled": False},
        agents={"booking": {"adapter": "completion-booking", "completion_sample_rate": 0.0,
                            "tree_sample_rate": 0.0, "max_tokens_per_minute": 1}},
    )  # fmt: skip
    scorers = Scorers(cfg, _lm())
    for _ in range(3):
        assert 0.0 <= (await scorers.score_adapter(RESTAURANT, "completion-booking")).p_end <= 1.0
        assert (await (await scorers.tree_request(TRAVEL, "base")).expand()).leaves >= 1


async def test_errors_propagate_and_a_request_can_be_retried(tok_dir: Path) -> None:
    lm = _lm()
    scorers = Scorers(_config(tok_dir), lm)
    request = await scorers.completion_request(RESTAURANT, "completion-booking")
    lm.fail_next = 1
    with pytest.raises(RetryableError):
        await request.score()
    assert (await request.score()).variant == "adapter"


async def test_prompts_are_built_off_the_event_loop(tok_dir: Path) -> None:
    scorers = Scorers(_config(tok_dir), _lm())
    seen: list[int] = []
    for name in ("completion_adapter", "completion_instruct", "tree"):
        real = getattr(scorers.prompts, name)

        def spy(*a: Any, _real: Any = real, **k: Any) -> Any:
            seen.append(threading.get_ident())
            return _real(*a, **k)

        setattr(scorers.prompts, name, spy)
    await scorers.score_adapter(RESTAURANT, "completion-booking")
    await scorers.completion_request(RESTAURANT, None)
    await scorers.tree_request(TRAVEL, "base")
    assert len(seen) == 3
    assert threading.get_ident() not in seen
    await scorers.stop()


async def test_the_trust_gauge_is_optional_and_wired_by_the_live_hooks(tok_dir: Path) -> None:
    cfg = _config(tok_dir, agents={"booking": {"adapter": "completion-booking", "validation_f1": 0.99}})
    values: list[tuple[str, float]] = []
    Scorers(cfg, _lm(), trust_gauge=lambda label, v: values.append((label, v))).trust.publish_configured(str)
    assert ("booking", 1.0) in values
    Scorers(cfg, _lm()).trust.publish_configured(str)  # no gauge: nothing to set, no error
    registry = CollectorRegistry()
    ScoringHooks.from_config(cfg, registry, client=_lm())
    assert registry.get_sample_value("sidecar_completion_adapter_trusted", {"agent": "booking"}) == 1.0


async def test_an_external_client_is_the_callers(tok_dir: Path) -> None:
    scorers = Scorers(_config(tok_dir), _lm())
    await scorers.stop()  # before start: safe
    await scorers.start()
    await scorers.stop()
    await scorers.stop()  # twice: safe
    assert scorers.health().ready and scorers.health().detail == "external client"


async def test_from_config_owns_its_vllm_client(tok_dir: Path) -> None:
    registry = CollectorRegistry()
    cfg = _config(tok_dir, vllm={"base_url": "http://127.0.0.1:9/v1"})
    scorers = Scorers.from_config(cfg, registry)
    assert type(scorers.client).__name__ == "VllmClient"
    assert scorers.health().detail != "external client"
    await scorers.stop()  # before start: safe
    await scorers.start()
    await scorers.stop()
    await scorers.stop()
