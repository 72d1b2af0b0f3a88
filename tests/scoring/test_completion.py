"""The completion scorer's arithmetic on the toy model (the real-vLLM proof is in test_vllm_scoring)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import pytest

from sidecar.scoring.client import GeneratedChoice, VllmRequestError
from sidecar.scoring.completion import CompletionScorer, raw_logprobs_confirmed
from tests.scoring.fakes import ToyLM

END = 2


def _decode(ids: Sequence[int]) -> str:
    return " ".join(f"t{i}" for i in ids)


def _scorer(lm: Any, end_ids: Sequence[int] = (END,), **kw: Any) -> CompletionScorer:
    return CompletionScorer(lm, end_ids=end_ids, stop_token_ids=[0], max_remaining_tokens=5, decode=_decode, **kw)


def _prompt_with(lm: ToyLM, *, end_in_top: int, greedy_end: bool | None = None) -> list[int]:
    """Search prompts until the end tag's rank in the first position matches the wish."""
    for a in range(3, 512):
        for b in range(3, 40):
            prompt = [a, b]
            d = lm.dist(prompt)
            rank = sorted(d, key=lambda t: (-d[t], t)).index(END)
            if (rank < end_in_top) and (greedy_end is None or greedy_end == (rank == 0)):
                return prompt
            if end_in_top == 0 and rank >= lm.max_logprobs:
                return prompt
    raise AssertionError("no prompt found")


async def test_end_in_top_k_is_read_directly() -> None:
    lm = ToyLM(vocab=64, seed=4, peak=0.4)
    prompt = _prompt_with(lm, end_in_top=20, greedy_end=False)
    score = await _scorer(lm).score("m", prompt)
    assert score.p_end_method == "top_k"
    assert score.requests == 1
    assert score.logprob_end == pytest.approx(lm.dist(prompt)[END])
    assert not score.complete
    assert score.remaining_token_ids
    assert score.remaining_text == _decode(score.remaining_token_ids)


async def test_greedy_end_tag_is_complete() -> None:
    lm = ToyLM(vocab=64, seed=4, peak=0.4)
    prompt = _prompt_with(lm, end_in_top=1, greedy_end=True)
    score = await _scorer(lm).score("m", prompt)
    assert score.complete
    assert score.remaining_text == ""
    assert score.p_end > 0.0
    assert score.outcome(include_text=True).get("remaining_tasks") is None


async def test_end_outside_top_k_uses_the_verified_forced_request() -> None:
    lm = ToyLM(vocab=512, seed=4, peak=3.0, max_logprobs=3)
    prompt = _prompt_with(lm, end_in_top=0)
    score = await _scorer(lm).score("m", prompt)
    assert not score.end_in_top_k
    assert score.p_end_method == "forced"
    assert score.requests == 2
    assert score.logprob_end == pytest.approx(lm.dist(prompt)[END])
    assert score.p_end == pytest.approx(math.exp(lm.dist(prompt)[END]))
    assert not any(r.get("prompt_logprobs") for r in lm.requests)


async def test_processed_logprobs_server_is_detected_and_the_exact_fallback_used() -> None:
    lm = ToyLM(vocab=512, seed=4, peak=3.0, max_logprobs=3)
    lm.processed_logprobs = True
    prompt = _prompt_with(lm, end_in_top=0)
    score = await _scorer(lm).score("m", prompt)
    assert score.p_end_method == "prompt_logprobs"
    assert score.logprob_end == pytest.approx(lm.dist(prompt)[END])
    assert score.p_end < 1.0


async def test_server_refusing_allowed_token_ids_falls_back() -> None:
    class NoForcing(ToyLM):
        async def forced_next_token(self, model: str, prompt: Sequence[int], token_id: int) -> GeneratedChoice:
            raise VllmRequestError("http_400", "unknown field")

    lm = NoForcing(vocab=512, seed=4, peak=3.0, max_logprobs=3)
    prompt = _prompt_with(lm, end_in_top=0)
    score = await _scorer(lm).score("m", prompt)
    assert score.p_end_method == "prompt_logprobs"
    assert score.logprob_end == pytest.approx(lm.dist(prompt)[END])


async def test_multi_token_marker_probability_is_the_product() -> None:
    lm = ToyLM(vocab=64, seed=9, peak=1.0, max_logprobs=5)
    marker = [7, 8, 9]
    prompt = [5, 6]
    score = await _scorer(lm, end_ids=marker, variant="instruct", end_text="t7 t8 t9").score("m", prompt)
    expected = sum(lm.dist(prompt + marker[:j])[t] for j, t in enumerate(marker))
    assert score.logprob_end == pytest.approx(expected)


async def test_instruct_verdict_follows_the_greedy_text() -> None:
    lm = ToyLM(vocab=64, seed=9, peak=1.0)
    prompt = [5, 6]
    greedy = (await lm.generate("m", [prompt], max_tokens=2, top_logprobs=1))[0].token_ids
    marker_text = _decode(greedy)
    score = await _scorer(lm, end_ids=list(greedy), variant="instruct", end_text=marker_text).score("m", prompt)
    assert score.complete
    assert score.p_end_method == "top_k"
    assert score.logprob_end == pytest.approx(sum(lm.dist(prompt + list(greedy[:j]))[t] for j, t in enumerate(greedy)))


def test_raw_check() -> None:
    assert raw_logprobs_confirmed({2: -9.0, 5: -0.1}, {5: -0.1, 6: -2.0}, 2)
    assert not raw_logprobs_confirmed({2: 0.0}, {5: -0.1}, 2)  # renormalised: no alternative
    assert not raw_logprobs_confirmed({2: -9.0, 5: -0.5}, {5: -0.1}, 2)  # another distribution
    assert not raw_logprobs_confirmed({2: -9.0, 5: -math.inf}, {5: -0.1}, 2)


def test_empty_end_sequence_is_refused() -> None:
    with pytest.raises(ValueError, match="end sequence"):
        _scorer(ToyLM(), end_ids=[])


async def test_exact_token_ids_give_the_verdict_in_one_request() -> None:
    lm = ToyLM(seed=5)
    lm.exact_ids = True
    scorer = CompletionScorer(lm, end_ids=[0], stop_token_ids=[1], max_remaining_tokens=4, decode=str)
    prompt = [3, 4, 5]
    score = await scorer.score("m", prompt)
    assert score.requests == 1 and score.p_end_method == "token_ids"
    assert score.logprob_end == pytest.approx(lm.dist(prompt)[0])
    assert lm.requests[0]["logprob_token_ids"] == [0]
    best = min(lm.dist(prompt), key=lambda t: (-lm.dist(prompt)[t], t))
    assert score.complete == (best == 0)
