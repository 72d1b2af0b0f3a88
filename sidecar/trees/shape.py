"""A response tree as the renderer draws it: branches, their order on screen and their probability mass.

Input is what the scorer emits (:class:`~sidecar.contract.TreeBranch`, built by
:func:`sidecar.scoring.tree.branch_views`): every root-to-leaf path as (parent, split offset in
characters from the root, own text, path logprob, complete, truncated). The tree is taken as
untrusted data: a parent index that does not point at an earlier branch, a split outside the
parent's span, a NaN or positive logprob, any text, are all drawn as something sane, never raised.

Probability mass: each branch's leaf has probability ``exp(logprob)`` (the paper's Figure 2 draws
less probable branches lighter). A stretch of a branch carries the mass of every leaf below it:
its own leaf plus the subtrees of the children that split off *after* that stretch. Masses are
therefore the probability the tree covers, a lower bound of the model's probability of that
prefix (the tree leaves out continuations under the threshold alpha).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol


class BranchLike(Protocol):
    """The fields of :class:`~sidecar.contract.TreeBranch` the renderer reads."""

    @property
    def parent(self) -> int | None: ...
    @property
    def split_text_chars(self) -> int: ...
    @property
    def text(self) -> str: ...
    @property
    def logprob(self) -> float: ...
    @property
    def complete(self) -> bool: ...
    @property
    def truncated(self) -> str | None: ...


@dataclass(frozen=True, slots=True)
class ShapeBranch:
    """One branch as drawn: starts ``start`` characters from the root, spans ``length`` characters.

    ``text`` is None when text is not kept (the live view without ``alerting.include_text``): the
    shape and the numbers are drawn, no words.
    """

    parent: int | None
    start: int
    length: int
    logprob: float
    complete: bool
    truncated: str | None
    text: str | None = None


@dataclass(frozen=True, slots=True)
class TreeShape:
    """A sanitised tree: ``branches[0]`` is the root path, every parent precedes its children."""

    branches: tuple[ShapeBranch, ...]
    dropped: int = 0  # branches beyond the cap, not drawn
    children: tuple[tuple[int, ...], ...] = field(default=(), repr=False)

    @property
    def leaves(self) -> int:
        return len(self.branches)

    @property
    def has_text(self) -> bool:
        return any(b.text is not None for b in self.branches)

    def best(self) -> int | None:
        """The most probable complete branch, else the most probable one (as the alert reports it)."""
        if not self.branches:
            return None
        done = [i for i, b in enumerate(self.branches) if b.complete]
        pool = done or range(len(self.branches))
        return max(pool, key=lambda i: (self.branches[i].logprob, -i))

    def best_path(self) -> set[int]:
        """The best branch and its ancestors."""
        out: set[int] = set()
        i = self.best()
        while i is not None and i not in out:
            out.add(i)
            i = self.branches[i].parent
        return out

    def subtree_mass(self) -> list[float]:
        """Per branch: its leaf's probability plus its children's subtrees (clamped to [0, 1])."""
        mass = [probability(b.logprob) for b in self.branches]
        for i in range(len(self.branches) - 1, 0, -1):  # children come after their parent
            parent = self.branches[i].parent
            if parent is not None:
                mass[parent] += mass[i]
        return [min(1.0, m) for m in mass]

    def segments(self, index: int, mass: Sequence[float]) -> list[tuple[int, int, float]]:
        """Branch ``index`` cut at its children's split points: (from, to, mass) in characters."""
        b = self.branches[index]
        end = b.start + b.length
        kids = sorted(self.children[index], key=lambda c: self.branches[c].start)
        cuts = sorted({b.start, end, *(self.branches[c].start for c in kids)})
        out: list[tuple[int, int, float]] = []
        own = probability(b.logprob)
        for a, z in itertools.pairwise(cuts):
            below = sum(mass[c] for c in kids if self.branches[c].start >= z)
            out.append((a, z, min(1.0, own + below)))
        if not out:
            out.append((b.start, end, min(1.0, own + sum(mass[c] for c in kids))))
        return out

    def rows(self) -> list[int]:
        """Screen order, top to bottom: depth first, the child that splits latest nearest its parent.

        Every branch's subtree lies right of its split point, so with the latest split first no
        connector crosses a lane drawn above it.
        """
        order: list[int] = []
        if not self.branches:
            return order
        stack = [0]
        while stack:
            i = stack.pop()
            order.append(i)
            kids = sorted(self.children[i], key=lambda c: (self.branches[c].start, self.branches[c].logprob))
            stack.extend(kids)  # popped last-first: the latest split comes right after its parent
        return order

    def full_text(self, index: int) -> str | None:
        """The branch's whole response: its ancestors' text up to each split, then its own."""
        b = self.branches[index]
        if b.text is None:
            return None
        parts = [b.text]
        cut = b.start
        i = b.parent
        seen = {index}
        while i is not None and i not in seen:
            seen.add(i)
            p = self.branches[i]
            parts.append((p.text or "")[: max(0, cut - p.start)])
            cut = p.start
            i = p.parent
        return "".join(reversed(parts))


def probability(logprob: float) -> float:
    """``exp(logprob)`` for a path logprob, 0 for anything that is not a finite value <= 0."""
    if not math.isfinite(logprob):
        return 0.0
    return math.exp(min(0.0, logprob))


def build_shape(
    branches: Sequence[BranchLike],
    *,
    keep_text: bool,
    max_branches: int = 512,
    max_text_chars: int = 2000,
    max_total_text_chars: int | None = None,
) -> TreeShape:
    """Sanitise scorer output into a :class:`TreeShape`: at most ``max_branches`` branches, each
    text cut to ``max_text_chars`` and all of them together to ``max_total_text_chars`` (earlier
    branches, the greedy path first, keep theirs); without ``keep_text`` only lengths remain."""
    kept: list[ShapeBranch] = []
    budget = max_total_text_chars if max_total_text_chars is not None else max_branches * max_text_chars
    for i, raw in enumerate(branches[:max_branches]):
        text = raw.text if isinstance(raw.text, str) else ""
        parent = raw.parent
        if i == 0 or not isinstance(parent, int) or not 0 <= parent < i:
            parent = None if i == 0 else 0  # an orphan hangs off the root rather than vanishing
        start = 0
        if parent is not None:
            p = kept[parent]
            start = min(max(int(raw.split_text_chars), p.start), p.start + p.length)
        logprob = float(raw.logprob) if math.isfinite(raw.logprob) else -math.inf
        kept.append(
            ShapeBranch(
                parent=parent,
                start=start,
                length=len(text),
                logprob=min(0.0, logprob),
                complete=bool(raw.complete),
                truncated=raw.truncated if raw.truncated in ("depth", "budget") else None,
                text=text[: min(max_text_chars, budget)] if keep_text else None,
            )
        )
        if keep_text:
            budget -= min(len(text), max_text_chars, budget)
    children: list[list[int]] = [[] for _ in kept]
    for i, b in enumerate(kept):
        if b.parent is not None:
            children[b.parent].append(i)
    return TreeShape(
        branches=tuple(kept),
        dropped=max(0, len(branches) - max_branches),
        children=tuple(tuple(c) for c in children),
    )
