"""Completion detection (paper Section 4.2, Appendix B.2; DESIGN.md "Completion").

For c_k = [p_1, r_1, ..., p_k, r_k] the scorer asks for the greedy continuation with the top
``max_logprobs`` logprobs at each position, in ONE request:

* ``complete`` iff the greedy continuation *is* the end sequence (the paper's rule). For an adapter
  the end sequence is the single end-tag token; for the instruct variant it is the tokens of the
  instruct end marker (``<end of system logs>``), and the text check is used (the continuation,
  stripped of leading space, starts with the marker), which does not depend on one tokenisation.
* ``p_end`` = P(end sequence | c_k), exact, never "missing from top-k means 0". For the end tag
  it is read from the logprob of its token id at the first position when it is among the top-k.
  When it is not, a second 1-token request on the *same prompt* forces the end tag
  (``allowed_token_ids``) and reads the logprob vLLM reports for it. That is only exact if the
  server reports raw logprobs (computed before the constraint; vLLM's default ``--logprobs-mode
  raw_logprobs``): with processed logprobs the forced token would get probability 1. So it is
  verified on every use: the forced response also carries the top-1 *unconstrained* alternative,
  whose logprob must equal the one of the first request; a renormalised distribution cannot pass
  that check. This request shares the prompt with the first one, so vLLM's prefix cache serves
  it. If the check fails (or the server does not support ``allowed_token_ids``), the last resort
  scores ``prompt + end`` with ``prompt_logprobs``, which is exact whatever the server's mode but
  bypasses the prefix cache (a full prefill). ``logit_bias`` is never used. For the multi-token
  instruct marker the same is done token by token (positions where the greedy continuation follows
  the marker contribute their logprobs directly). ``p_end_method`` says which path was taken.
* When not complete, the greedy continuation (bounded by ``max_remaining_tokens``) is the
  "remaining tasks" text shown to humans.
* An agent may use the **threshold rule** instead (``scoring.agents.<name>.completion_rule``):
  complete iff P(end) >= a threshold calibrated on its own held-back conversations
  (:func:`with_threshold`). P(end) is the same exact value; the greedy verdict stays in the
  outcome as ``greedy_complete``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from sidecar.errors import PermanentError
from sidecar.scoring.client import LLMClient

Variant = Literal["adapter", "instruct"]
# Logprob agreement that identifies the same raw distribution; float32 kernels differ by ~1e-5
# between batch shapes.
RAW_TOLERANCE = 1e-3


@dataclass(frozen=True, slots=True)
class CompletionScore:
    """The verdict on one conversation prefix."""

    variant: Variant
    p_end: float
    logprob_end: float
    complete: bool
    end_in_top_k: bool
    remaining_token_ids: tuple[int, ...]
    remaining_text: str
    generated_tokens: int
    requests: int
    p_end_method: str = "top_k"
    greedy_complete: bool | None = None  # set when another rule decided ``complete``

    def outcome(self, *, include_text: bool) -> dict[str, Any]:
        out: dict[str, Any] = {
            "variant": self.variant,
            "p_end": round(self.p_end, 8),
            "logprob_end": round(self.logprob_end, 6) if math.isfinite(self.logprob_end) else None,
            "complete": self.complete,
            "end_in_top_k": self.end_in_top_k,
            "p_end_method": self.p_end_method,
            "generated_tokens": self.generated_tokens,
            "requests": self.requests,
        }
        if self.greedy_complete is not None:
            out["greedy_complete"] = self.greedy_complete
        if include_text and not self.complete:
            out["remaining_tasks"] = self.remaining_text
        return out


def with_threshold(score: CompletionScore, threshold: float) -> CompletionScore:
    """The verdict under the threshold rule: complete iff P(end) >= ``threshold``; P(end) unchanged.

    A prefix the threshold calls complete keeps no remaining-tasks text (even if the greedy
    continuation was something else); one it calls incomplete keeps the greedy continuation, which
    is empty when that continuation was the end tag.
    """
    complete = score.p_end >= threshold
    return replace(
        score,
        complete=complete,
        greedy_complete=score.complete,
        remaining_token_ids=() if complete else score.remaining_token_ids,
        remaining_text="" if complete else score.remaining_text,
    )


class CompletionScorer:
    """Scores c_k on one served model with one end sequence."""

    def __init__(
        self,
        client: LLMClient,
        *,
        end_ids: Sequence[int],
        stop_token_ids: Sequence[int],
        max_remaining_tokens: int,
        decode: Callable[[Sequence[int]], str],
        variant: Variant = "adapter",
        end_text: str | None = None,
    ) -> None:
        if not end_ids:
            raise ValueError("the end sequence must have at least one token")
        self._client = client
        self.end_ids = tuple(end_ids)
        self.variant = variant
        self.end_text = end_text
        stops = set(stop_token_ids)
        if variant == "adapter":
            stops.add(self.end_ids[0])
        self.stop_ids = sorted(stops)
        self.max_remaining_tokens = max_remaining_tokens
        self._decode = decode

    async def score(self, model: str, prompt: Sequence[int]) -> CompletionScore:
        """One verdict on ``prompt`` (token ids of c_k) with served model ``model``.

        Where the server can be asked for the end tag's logprob directly (``logprob_token_ids``,
        see :meth:`LLMClient.exact_ids_usable`) that one request gives the exact P(end), the greedy
        verdict and the remaining tasks; otherwise the top-k logprobs do, with a forced one-token
        request when the end tag is not among them.
        """
        n_end = len(self.end_ids)
        max_tokens = max(1, self.max_remaining_tokens, n_end if self.variant == "instruct" else 1)
        exact_ids = self.end_ids if await self._client.exact_ids_usable(model) else ()
        (choice,) = await self._client.generate(
            model,
            [prompt],
            max_tokens=max_tokens,
            top_logprobs=self._client.max_logprobs,
            stop_token_ids=self.stop_ids,
            logprob_token_ids=exact_ids,
        )
        requests = 1
        tokens = choice.token_ids
        logprob = 0.0
        exact = True
        in_top_k = True
        for j, end_id in enumerate(self.end_ids):
            if j >= len(tokens):
                exact = False
                in_top_k = False
                break
            top = choice.top_logprobs[j]
            if end_id in top:
                logprob += top[end_id]
            else:
                in_top_k = False
                exact = False
                break
            if tokens[j] != end_id:
                # Past a divergence the positions' context differs from prompt + end[:j+1].
                if j + 1 < n_end:
                    exact = False
                break
        method = "token_ids" if exact_ids else "top_k"
        if not exact:
            logprob, method, extra = await self._exact(model, prompt, choice.top_logprobs[0] if tokens else {})
            requests += extra
        if self.variant == "adapter":
            complete = bool(tokens) and tokens[0] == self.end_ids[0]
            remaining = tuple(t for t in tokens if t not in self.stop_ids)
        else:
            text = self._decode(tokens).lstrip()
            complete = self.end_text is not None and text.startswith(self.end_text)
            remaining = tuple(t for t in tokens if t not in self.stop_ids)
        remaining_text = "" if complete else self._decode(remaining)
        return CompletionScore(
            variant=self.variant,
            p_end=math.exp(logprob),
            logprob_end=logprob,
            complete=complete,
            end_in_top_k=in_top_k,
            remaining_token_ids=() if complete else remaining,
            remaining_text=remaining_text,
            generated_tokens=len(tokens),
            requests=requests,
            p_end_method=method,
        )

    async def _exact(self, model: str, prompt: Sequence[int], reference: Mapping[int, float]) -> tuple[float, str, int]:
        """P(end sequence) when the first request could not give it: (logprob, method, requests)."""
        total = 0.0
        requests = 0
        for j, end_id in enumerate(self.end_ids):
            try:
                forced = await self._client.forced_next_token(model, [*prompt, *self.end_ids[:j]], end_id)
            except PermanentError:
                break  # e.g. a server without allowed_token_ids: use the last resort
            requests += 1
            if not forced.token_ids or forced.token_ids[0] != end_id:
                break
            if j == 0 and not raw_logprobs_confirmed(forced.top_logprobs[0], reference, end_id):
                break
            total += forced.logprobs[0]
        else:
            return total, "forced", requests
        full = await self._client.prompt_token_logprobs(model, [*prompt, *self.end_ids])
        tail = full[len(prompt) :]
        return sum(v for v in tail if v is not None), "prompt_logprobs", requests + 1


def raw_logprobs_confirmed(forced_top: Mapping[int, float], reference: Mapping[int, float], forced_id: int) -> bool:
    """Whether a forced response's alternatives carry the unconstrained logprobs of ``reference``.

    Needs at least one alternative token, present in both, with the same logprob (1e-3): under a
    renormalised (processed) distribution the alternatives would be -inf or absent.
    """
    seen = 0
    for tid, lp in forced_top.items():
        if tid == forced_id:
            continue
        ref = reference.get(tid)
        if ref is None or not math.isfinite(lp) or abs(ref - lp) > RAW_TOLERANCE:
            return False
        seen += 1
    return seen > 0
