"""A deterministic in-process stand-in for vLLM, for fast unit tests of the scorers' logic.

``ToyLM`` defines a next-token distribution for every context (a hash of the context picks a few
favoured tokens and their weights), and answers :class:`~sidecar.scoring.client.LLMClient` calls
exactly like vLLM would for a greedy request: the generated ids, their logprobs, and the top-k
alternatives at each position (the sampled token included). Behaviour-proving tests use the real
vLLM server; this one only makes algorithm tests fast and exhaustive.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Mapping, Sequence

from sidecar.errors import RetryableError
from sidecar.scoring.client import GeneratedChoice, LLMClient


class ToyLM:
    def __init__(self, vocab: int = 12, *, seed: int = 0, end_ids: Sequence[int] = (0,), max_logprobs: int = 20,
                 peak: float = 2.5) -> None:  # fmt: skip
        self.vocab = vocab
        self.seed = seed
        self.end_ids = tuple(end_ids)
        self.max_logprobs = max_logprobs
        self.peak = peak
        self.requests: list[dict[str, object]] = []
        self.generated = 0
        self.fail_next = 0
        self.fail_calls: set[int] = set()  # 1-based generate() calls that fail (retryable)
        self.calls = 0
        # Simulates vLLM's --logprobs-mode processed_logprobs: a forced token gets probability 1.
        self.processed_logprobs = False
        # Answers logprob_token_ids requests (exact logprobs of listed ids), as vLLM >= 0.26 does.
        self.exact_ids = False

    def dist(self, context: Sequence[int]) -> dict[int, float]:
        """Log-probabilities of every token after ``context``."""
        h = hashlib.blake2b(repr((self.seed, tuple(context))).encode(), digest_size=16).digest()
        rng = random.Random(int.from_bytes(h, "big"))
        # A few tokens stand out (u**4), as in a trained model's peaked next-token distribution.
        logits = [6.0 * self.peak * rng.random() ** 4 for _ in range(self.vocab)]
        z = math.log(sum(math.exp(x) for x in logits))
        return {i: x - z for i, x in enumerate(logits)}

    def _top(self, dist: Mapping[int, float], k: int, sampled: int) -> dict[int, float]:
        best = sorted(dist.items(), key=lambda kv: (-kv[1], kv[0]))[:k]
        out = dict(best)
        out[sampled] = dist[sampled]
        return out

    async def generate(
        self,
        model: str,
        prompts: Sequence[Sequence[int]],
        *,
        max_tokens: int,
        top_logprobs: int,
        stop_token_ids: Sequence[int] = (),
        logprob_token_ids: Sequence[int] = (),
    ) -> list[GeneratedChoice]:
        self.calls += 1
        if self.fail_next > 0 or self.calls in self.fail_calls:
            self.fail_next = max(0, self.fail_next - 1)
            raise RetryableError("toy outage")
        self.requests.append(
            {"model": model, "n": len(prompts), "max_tokens": max_tokens, "logprob_token_ids": list(logprob_token_ids)}
        )
        k = min(top_logprobs, self.max_logprobs)
        out = []
        for prompt in prompts:
            ctx = list(prompt)
            ids: list[int] = []
            lps: list[float] = []
            tops: list[dict[int, float]] = []
            for _ in range(max_tokens):
                d = self.dist(ctx)
                tok = min(d, key=lambda t: (-d[t], t))
                ids.append(tok)
                lps.append(d[tok])
                if logprob_token_ids:
                    tops.append({**{i: d[i] for i in logprob_token_ids}, tok: d[tok]})
                else:
                    tops.append(self._top(d, k, tok))
                ctx.append(tok)
                if tok in stop_token_ids:
                    break
            self.generated += len(ids)
            out.append(
                GeneratedChoice(tuple(ids), tuple(lps), tuple(tops), "stop" if len(ids) < max_tokens else "length")
            )
        return out

    async def exact_ids_usable(self, model: str) -> bool:
        return self.exact_ids

    async def forced_next_token(self, model: str, prompt: Sequence[int], token_id: int) -> GeneratedChoice:
        self.requests.append({"model": model, "forced": token_id})
        d = self.dist(prompt)
        if self.processed_logprobs:
            top = {token_id: 0.0}
            return GeneratedChoice((token_id,), (0.0,), (top,), "length")
        best = min(d, key=lambda t: (-d[t], t))
        return GeneratedChoice((token_id,), (d[token_id],), ({token_id: d[token_id], best: d[best]},), "length")

    async def prompt_token_logprobs(self, model: str, prompt: Sequence[int]) -> list[float | None]:
        self.requests.append({"model": model, "prompt_logprobs": True})
        out: list[float | None] = [None]
        for i in range(1, len(prompt)):
            out.append(self.dist(prompt[:i])[prompt[i]])
        return out


async def brute_force_tree(
    client: LLMClient,
    model: str,
    prompt: Sequence[int],
    *,
    alpha: float,
    top_k: int,
    depth: int,
    stop_ids: Sequence[int],
) -> tuple[int, float | None, list[float]]:
    """Every top-K continuation, one token per request: (leaves, max complete logprob, leaf logprobs).

    The greedy token always continues a path (as in the fast expansion); an alternative starts a
    new path when its path probability is at least ``alpha``.
    """
    log_alpha = math.log(alpha)
    frontier: list[tuple[list[int], float]] = [([], 0.0)]
    complete: list[float] = []
    leaves: list[float] = []
    while frontier:
        choices = await client.generate(
            model, [list(prompt) + toks for toks, _ in frontier], max_tokens=1, top_logprobs=top_k
        )
        nxt: list[tuple[list[int], float]] = []
        for (toks, lp), choice in zip(frontier, choices, strict=True):
            greedy = choice.token_ids[0]
            kids = [(greedy, choice.logprobs[0])]
            kids += [(t, v) for t, v in choice.top_logprobs[0].items() if t != greedy and lp + v >= log_alpha]
            for t, v in kids:
                path = [*toks, t]
                if t in stop_ids:
                    complete.append(lp + v)
                    leaves.append(lp + v)
                elif len(path) >= depth:
                    leaves.append(lp + v)
                else:
                    nxt.append((path, lp + v))
        frontier = nxt
    return len(leaves), (max(complete) if complete else None), sorted(leaves)
