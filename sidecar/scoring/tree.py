"""Response trees (paper Section 4.3, Appendix B.3; DESIGN.md "Response tree").

Expansion: generate greedily from the prompt with the top-K logprobs at every position; wherever an
alternative token's *path probability* (product of token probabilities from the root) is at least
``alpha``, start a branch there (the branch's prompt is the parent's prompt, the parent's tokens up
to the split, and the alternative token); expand branches the same way. A branch ends at an
end-of-response token (any of ``stop_token_ids``), at a stop string in its generated text (the
next ``TURN`` header in the paper format), at the depth limit, or when the budget runs out.

Exactness: a token of probability ``p`` at a node of path probability ``P >= alpha`` can only
branch if ``P * p >= alpha``, so ``p >= alpha``, and at most ``floor(1/alpha)`` tokens have that;
``K = min(max_logprobs, ceil(1/alpha))`` alternatives therefore see all of them (when
``max_logprobs`` is the smaller, the tree is exact up to rank ``max_logprobs``). Along a branch the
path probability only falls, so once it is below ``alpha`` nothing more can branch off it.

Cost: every tree token is generated once. Each branch is a new request whose prompt is a token-id
*prefix* of an earlier request, so vLLM's prefix cache serves its prefill; the branches of one
level are batched into one request per distinct ``max_tokens``. The forced first token of a branch
is part of the prompt, so generated tokens <= distinct tree tokens except for tokens generated past
a stop string (vLLM cannot see it across the prompt boundary), which are counted as waste.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sidecar.contract import TreeBranch, TreeScored
from sidecar.scoring.admission import all_or_nothing
from sidecar.scoring.client import GeneratedChoice, LLMClient


@dataclass(frozen=True, slots=True)
class TreeBudget:
    """Limits of one tree; any hit sets ``budget_hit`` in the result."""

    max_depth_tokens: int = 32
    max_generated_tokens: int = 1024
    max_requests: int = 64
    max_leaves: int = 256


@dataclass(slots=True)
class Branch:
    """One root-to-leaf path: ``tokens`` generated from the root; ``parent``/``split`` locate it."""

    tokens: list[int]
    logprob: float
    parent: int | None
    split: int
    complete: bool = False
    truncated: str | None = None  # "depth" | "budget" | "gate"

    def to_json(self) -> dict[str, Any]:
        return {
            "parent": self.parent,
            "split": self.split,
            "tokens": self.tokens[self.split :],
            "logprob": round(self.logprob, 6),
            "complete": self.complete,
            "truncated": self.truncated,
        }


@dataclass(slots=True)
class ResponseTree:
    """An expanded tree and its statistics."""

    alpha: float
    top_k: int
    branches: list[Branch] = field(default_factory=list)
    requests: int = 0
    generated_tokens: int = 0
    budget_hit: str | None = None  # which limit truncated the tree, if any
    grown: bool = True  # False: a gate kept it to its probe (the greedy branch), see expand()

    @property
    def leaves(self) -> int:
        return len(self.branches)

    @property
    def distinct_tokens(self) -> int:
        """Tokens in the tree, each shared prefix counted once."""
        return sum(len(b.tokens) - b.split for b in self.branches)

    def best_branch(self) -> Branch | None:
        """The most probable *complete* branch (None if no branch reached an end of response)."""
        done = [b for b in self.branches if b.complete]
        return max(done, key=lambda b: b.logprob) if done else None

    @property
    def max_logprob(self) -> float | None:
        best = self.best_branch()
        return None if best is None else best.logprob

    def stats(self) -> dict[str, Any]:
        """The small JSON-able summary recorded per tree (no text)."""
        best = self.max_logprob
        return {
            "leaves": self.leaves,
            "complete_leaves": sum(1 for b in self.branches if b.complete),
            "max_logprob": None if best is None else round(best, 6),
            "alpha": self.alpha,
            "top_k": self.top_k,
            "requests": self.requests,
            "generated_tokens": self.generated_tokens,
            "distinct_tokens": self.distinct_tokens,
            "budget_hit": self.budget_hit,
            "grown": self.grown,
        }

    def to_json(self) -> dict[str, Any]:
        """The whole tree: statistics plus every branch as (parent, split, own tokens)."""
        return {**self.stats(), "branches": [b.to_json() for b in self.branches]}


@dataclass(slots=True)
class _Pending:
    branch: int
    max_tokens: int


class TreeExpander:
    """Builds response trees on an :class:`LLMClient`."""

    def __init__(
        self,
        client: LLMClient,
        *,
        alpha: float,
        budget: TreeBudget,
        stop_token_ids: Sequence[int],
        stop_strings: Sequence[str] = (),
        decode: Callable[[Sequence[int]], str] | None = None,
    ) -> None:
        if not 0 < alpha < 1:
            raise ValueError("alpha must be in (0, 1)")
        if stop_strings and decode is None:
            raise ValueError("stop strings need a decoder")
        self._client = client
        self.alpha = alpha
        self.log_alpha = math.log(alpha)
        self.top_k = max(1, min(client.max_logprobs, math.ceil(1.0 / alpha - 1e-12)))
        self.budget = budget
        self._stop_ids = frozenset(stop_token_ids)
        self._stop_strings = tuple(s for s in stop_strings if s)
        self._decode = decode

    def _stop_string_end(self, tokens: Sequence[int], start: int) -> int | None:
        """Index of the token that completes a stop string in ``tokens`` (searched from ``start``)."""
        if not self._stop_strings or self._decode is None:
            return None
        decode = self._decode
        full = decode(tokens)
        if not any(s in full for s in self._stop_strings):
            return None
        for i in range(max(start, 0), len(tokens)):
            text = decode(tokens[: i + 1])
            if any(s in text for s in self._stop_strings):
                return i
        return None

    async def expand(
        self,
        model: str,
        prompt: Sequence[int],
        *,
        probe_tokens: int | None = None,
        grow: Callable[[ResponseTree], bool] | None = None,
    ) -> ResponseTree:
        """Expand the tree of ``prompt`` on served model ``model``.

        With ``grow``, the first request (the greedy branch from the root, at most ``probe_tokens``
        of it; ``None``: the whole depth) is a probe: ``grow(tree)`` then sees the tree so far (the
        root branch and the alternatives found along it) and decides whether to expand the rest.
        Nothing is generated twice: a grown tree continues from the probe, and is the same tree as
        without one (when the probe stopped short of the depth, the root's continuation is a request
        of a later level, so the request count may differ and a budget cut may fall on other
        branches). A tree not grown keeps what the probe saw, ``grown`` False, its pending
        branches truncated ``"gate"``.
        """
        tree = ResponseTree(alpha=self.alpha, top_k=self.top_k)
        tree.branches.append(Branch(tokens=[], logprob=0.0, parent=None, split=0))
        depth = self.budget.max_depth_tokens
        prompt = list(prompt)
        if grow is None:
            pending = [_Pending(0, depth)]
        else:
            first = depth if probe_tokens is None else max(1, min(probe_tokens, depth))
            pending = await self._level(tree, model, prompt, [_Pending(0, first)], probe=True)
            if not grow(tree):
                tree.grown = False
                for p in pending:
                    tree.branches[p.branch].truncated = "gate"
                return tree
        while pending:
            pending = await self._level(tree, model, prompt, pending)
        return tree

    async def _level(
        self, tree: ResponseTree, model: str, prompt: list[int], pending: list[_Pending], *, probe: bool = False
    ) -> list[_Pending]:
        """One level: the pending branches' requests, run together; returns the next level."""
        # Most probable first, so a budget cut drops the least probable branches.
        pending.sort(key=lambda p: -tree.branches[p.branch].logprob)
        groups: dict[int, list[_Pending]] = {}
        for p in pending:
            groups.setdefault(p.max_tokens, []).append(p)
        reserved = 0
        calls = []
        for max_tokens, group in groups.items():
            planned = self._plan(tree, max_tokens, group, reserved)
            if planned is not None:
                reserved += planned[0] * len(planned[1])
                calls.append(self._request(tree, model, prompt, *planned, probe=probe))
        # One level's requests run together: vLLM batches them (one request cannot carry
        # per-prompt max_tokens, so branches of different remaining depth go separately).
        out: list[_Pending] = []
        for new in await all_or_nothing(calls):
            out.extend(new)
        return out

    def _plan(
        self, tree: ResponseTree, max_tokens: int, group: list[_Pending], reserved: int
    ) -> tuple[int, list[_Pending]] | None:
        """Fit one request into the budget: (max_tokens, branches) or None; cuts what does not fit."""
        budget = self.budget
        if tree.requests >= budget.max_requests:
            self._truncate(tree, group, "requests")
            return None
        left = budget.max_generated_tokens - tree.generated_tokens - reserved
        if left <= 0:
            self._truncate(tree, group, "tokens")
            return None
        if max_tokens * len(group) > left:
            # Fewer branches at full length rather than every branch cut short.
            fit = max(1, left // max_tokens)
            self._truncate(tree, group[fit:], "tokens")
            group = group[:fit]
            max_tokens = min(max_tokens, left)
        tree.requests += 1
        return max_tokens, group

    async def _request(
        self,
        tree: ResponseTree,
        model: str,
        prompt: list[int],
        max_tokens: int,
        group: list[_Pending],
        *,
        probe: bool = False,
    ) -> list[_Pending]:
        """One batched request for ``group``; absorbs the results, returns branches to expand."""
        prompts = [prompt + tree.branches[p.branch].tokens for p in group]
        choices = await self._client.generate(
            model, prompts, max_tokens=max_tokens, top_logprobs=self.top_k, stop_token_ids=sorted(self._stop_ids)
        )
        new: list[_Pending] = []
        for p, choice in zip(group, choices, strict=True):
            tree.generated_tokens += len(choice.token_ids)
            new.extend(self._absorb(tree, p.branch, choice, max_tokens, probe=probe))
        return new

    def _truncate(self, tree: ResponseTree, group: Sequence[_Pending], why: str) -> None:
        for p in group:
            tree.branches[p.branch].truncated = "budget"
        if group and tree.budget_hit is None:
            tree.budget_hit = why

    def _end(self, branch: Branch, tokens: Sequence[int]) -> tuple[int, bool]:
        """How many of ``tokens`` belong to the response, and whether it ended within them."""
        cut = next((i + 1 for i, t in enumerate(tokens) if t in self._stop_ids), None)
        base = len(branch.tokens)
        stop_at = self._stop_string_end(branch.tokens + list(tokens[: cut or len(tokens)]), base)
        if stop_at is not None:
            return stop_at - base + 1, True
        return (cut, True) if cut is not None else (len(tokens), False)

    def _add_child(self, tree: ResponseTree, parent: int, tokens: list[int], logprob: float) -> _Pending | None:
        """Record a branch starting with forced token ``tokens[-1]``; return it if it needs expanding."""
        if len(tree.branches) >= self.budget.max_leaves:
            tree.budget_hit = tree.budget_hit or "leaves"
            return None
        split = len(tokens) - 1
        child = Branch(tokens=tokens, logprob=logprob, parent=parent, split=split)
        tree.branches.append(child)
        if tokens[-1] in self._stop_ids or self._stop_string_end(tokens, split) is not None:
            child.complete = True
            return None
        if len(tokens) >= self.budget.max_depth_tokens:
            child.truncated = "depth"
            return None
        return _Pending(len(tree.branches) - 1, self.budget.max_depth_tokens - len(tokens))

    def _absorb(
        self, tree: ResponseTree, index: int, choice: GeneratedChoice, requested: int, *, probe: bool = False
    ) -> list[_Pending]:
        """Append a generation to branch ``index``; return the new branches to expand (with ``probe``,
        a branch stopped at the probe's length is one of them: it continues to the depth)."""
        branch = tree.branches[index]
        tokens = choice.token_ids
        cut, branch.complete = self._end(branch, tokens)
        new: list[_Pending] = []
        path = branch.logprob
        for i in range(cut):
            for alt, alt_lp in choice.top_logprobs[i].items():
                if alt != tokens[i] and path + alt_lp >= self.log_alpha:
                    child = self._add_child(tree, index, [*branch.tokens, *tokens[:i], alt], path + alt_lp)
                    if child is not None:
                        new.append(child)
            path += choice.logprobs[i]
        branch.tokens.extend(tokens[:cut])
        branch.logprob = path
        if not branch.complete:
            if len(branch.tokens) >= self.budget.max_depth_tokens:
                branch.truncated = "depth"
            elif cut < requested:
                # vLLM stopped early for a reason of its own (e.g. max_model_len): an end.
                branch.complete = True
            elif probe:
                new.append(_Pending(index, self.budget.max_depth_tokens - len(branch.tokens)))
            else:
                branch.truncated = "budget"
                tree.budget_hit = tree.budget_hit or "tokens"
        return new


def most_probable_text(tree: ResponseTree, decode: Callable[[Sequence[int]], str], stop_ids: Sequence[int]) -> str:
    """Text of the most probable complete branch, without its end-of-response token."""
    best = tree.best_branch()
    if best is None:
        return ""
    toks = list(best.tokens)
    if toks and toks[-1] in set(stop_ids):
        toks = toks[:-1]
    return decode(toks)


def branch_views(
    tree: ResponseTree, decode: Callable[[Sequence[int]], str], stop_ids: Sequence[int]
) -> list[tuple[int | None, int, str, float, bool, str | None]]:
    """Every branch as (parent, split offset in the parent's *text*, own text, logprob, complete,
    truncated): what a renderer needs, end-of-response tokens left out."""
    stops = set(stop_ids)
    full_text: list[str] = []
    out: list[tuple[int | None, int, str, float, bool, str | None]] = []
    for b in tree.branches:
        toks = [t for t in b.tokens if t not in stops]
        text = decode(toks)
        full_text.append(text)
        if b.parent is None:
            out.append((None, 0, text, b.logprob, b.complete, b.truncated))
            continue
        prefix = decode([t for t in b.tokens[: b.split] if t not in stops])
        out.append((b.parent, len(prefix), text[len(prefix) :], b.logprob, b.complete, b.truncated))
    return out


def tree_event(
    tree: ResponseTree, model: str, best_branch: str | None, branches: Sequence[TreeBranch] = ()
) -> TreeScored:
    """The tree as the post-score stage sees it. The best-branch logprob is the most probable
    complete branch's, or, when the budget stopped every branch early, the most probable partial
    one's (an upper bound of what it would have reached)."""
    best = tree.best_branch() or max(tree.branches, key=lambda b: b.logprob, default=None)
    return TreeScored(
        leaves=tree.leaves,
        complete_leaves=sum(1 for b in tree.branches if b.complete),
        max_logprob=None if best is None else best.logprob,
        mean_token_logprob=None if best is None or not best.tokens else best.logprob / len(best.tokens),
        generated_tokens=tree.generated_tokens,
        budget_hit=tree.budget_hit,
        model=model,
        best_branch=best_branch,
        branches=tuple(branches),
    )
