"""``sidecar eval`` decides as ``sidecar run`` does: the default agent's threshold rule (an onboarded
adapter's calibrated P(end) threshold) turns P(end) into the verdict, and ``scoring.tree.enabled:
false`` is a completion-only evaluation (no tree requested, the setting kept)."""

from __future__ import annotations

import asyncio
from typing import Any

from sidecar.scoring.completion import CompletionScore
from sidecar.scoring.config import ScoringConfig
from sidecar.scoring.trust import AdapterTrust
from sidecar.tools.eval.dataset import EvalConversation
from sidecar.tools.eval.run import ConversationScorer, eval_scoring_config, settings_fingerprint
from sidecar.transcript.model import Message

THRESHOLD = 0.2


def config(**agent: Any) -> ScoringConfig:
    return ScoringConfig.model_validate(
        {"tokenizer": {"model_dir": "unused"}, "default_agent": {"adapter": "completion", **agent}}
    )


class FakeScorers:
    """What ConversationScorer uses of :class:`~sidecar.scoring.scorers.Scorers`: the adapter
    answers P(end) 0.3 with the greedy token not the end tag (greedy: incomplete)."""

    def __init__(self, cfg: ScoringConfig) -> None:
        self.config = cfg
        self.trust = AdapterTrust(cfg, lambda _label, _value: None)
        self.tree_calls = 0

    def tree_model(self, _agent: str | None) -> str:
        return "base"

    async def score_adapter(self, _messages: Any, _adapter: str) -> CompletionScore:
        return CompletionScore("adapter", 0.3, -1.2, False, True, (5,), "more", 1, 1)

    async def tree_request(self, _messages: Any, _model: str) -> Any:
        self.tree_calls += 1
        raise AssertionError("no tree when scoring.tree.enabled is false")


CONV = EvalConversation("c", (Message("user", "hi"), Message("assistant", "hello"), Message("user", "bye")), "s", "")


def test_the_routed_threshold_rule_decides_the_verdict() -> None:
    cfg = eval_scoring_config(config(completion_rule="threshold", p_end_threshold=THRESHOLD))
    scorer = ConversationScorer(FakeScorers(cfg), tree_turns="last", seed=0)  # type: ignore[arg-type]
    verdict = asyncio.run(scorer.completion(CONV.messages))
    assert verdict["complete"] is True  # P(end) 0.3 >= 0.2, where the greedy token said incomplete
    assert (verdict["rule"], verdict["threshold"], verdict["greedy_complete"]) == ("threshold", THRESHOLD, False)
    fingerprint = settings_fingerprint(cfg, "last", 0)
    assert (fingerprint["completion_rule"], fingerprint["p_end_threshold"]) == ("threshold", THRESHOLD)


def test_the_greedy_rule_stays_greedy() -> None:
    scorer = ConversationScorer(FakeScorers(eval_scoring_config(config())), tree_turns="last", seed=0)  # type: ignore[arg-type]
    verdict = asyncio.run(scorer.completion(CONV.messages))
    assert (verdict["complete"], verdict["rule"]) == (False, "greedy")


def test_trees_switched_off_are_a_completion_only_evaluation() -> None:
    base = config().model_copy(update={"tree": config().tree.model_copy(update={"enabled": False})})
    cfg = eval_scoring_config(base)
    assert cfg.tree.enabled is False
    scorers = FakeScorers(cfg)
    trees, judge = asyncio.run(
        ConversationScorer(scorers, tree_turns="all", seed=0).trees_and_judge(CONV)  # type: ignore[arg-type]
    )
    assert (trees, judge, scorers.tree_calls) == ([], None, 0)
    assert settings_fingerprint(cfg, "all", 0)["tree_turns"] == "off"
