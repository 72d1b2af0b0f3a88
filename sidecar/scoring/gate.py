"""The tree gate: grow a response tree only where a cheap first signal says the turn may be uncertain.

A full tree costs several requests; its first one, the greedy branch from the root, is cheap and
already says a lot. The gate sends that request alone (the *probe*: at most
``scoring.tree.gate.probe_tokens`` of the greedy branch, by default all of it) and grows the rest
of the tree only when the probe's logprob is among the lowest ``grow_share`` of the agent's recent
probes. Nothing is wasted: a grown tree continues from the probe
(:meth:`~sidecar.scoring.tree.TreeExpander.expand`).

Why this signal: the default uncertain-turn rule (``alerting.policy.uncertainty.rule:
best_logprob``) flags the trees whose best complete branch has the lowest logprob. The greedy
branch is one of the tree's branches, so when it completes its logprob is a *lower bound* of the
best branch's: a turn whose greedy branch is confident has a confident best branch too, and is not
one the rule flags. Turns whose greedy branch is unconfident may or may not be flagged: those get
a tree. The share to grow is relative, like the rule itself (absolute logprobs do not carry from
one model to another), and must sit well above the rule's ``target_rate`` (measured:
docs/scoring.md, "Trees where they matter").

Until an agent has ``min_signals`` probes every tree grows (the rule is warming up too). The window
is per process and starts empty after a restart, as the rule's does; a decision depends on the
traffic before it, so a replay after a crash may grow a tree the first run did not (the outcome
says which: ``grown``).
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right, insort
from collections import deque
from dataclasses import dataclass

from sidecar.scoring.config import TreeGateConfig
from sidecar.scoring.tree import ResponseTree

# The closed set of gate decisions (the metric's ``decision`` label).
DECISIONS = ("grown_uncertain", "grown_warming_up", "skipped_confident")


@dataclass(frozen=True, slots=True)
class GateDecision:
    grow: bool
    decision: str  # one of DECISIONS
    signal: float
    rank: float | None  # the signal's mid-rank in the window (low = unconfident); None while warming up


def probe_signal(tree: ResponseTree) -> float:
    """The cheap signal of a probed tree: the logprob of its greedy (root) branch so far."""
    return tree.branches[0].logprob


class _Window:
    """The last ``size`` signals of one agent, kept sorted for ranks in O(log n) + O(n) insertion."""

    def __init__(self, size: int) -> None:
        self._order: deque[float] = deque()
        self._sorted: list[float] = []
        self._size = size

    def __len__(self) -> int:
        return len(self._order)

    def rank(self, x: float) -> float:
        """Fraction of the window below ``x`` plus half of those equal (mid-rank)."""
        below = bisect_left(self._sorted, x)
        upto = bisect_right(self._sorted, x)
        return (below + 0.5 * (upto - below)) / len(self._sorted)

    def add(self, x: float) -> None:
        if len(self._order) == self._size:
            old = self._order.popleft()
            del self._sorted[bisect_left(self._sorted, old)]
        self._order.append(x)
        insort(self._sorted, x)


class TreeGate:
    """Decides per agent whether a probed tree grows. Not thread-safe: one event loop."""

    def __init__(self, config: TreeGateConfig) -> None:
        self.config = config
        self._agents: dict[str, _Window] = {}

    @property
    def enabled(self) -> bool:
        return self.config.mode == "cheap_signal"

    def decide(self, agent: str, signal: float) -> GateDecision:
        """Grow or not for ``signal`` (see :func:`probe_signal`), then add it to the agent's window."""
        cfg = self.config
        if not math.isfinite(signal):
            # A -inf (or a NaN from a broken server) is no confidence at all; it stays out of the window.
            return GateDecision(True, "grown_uncertain", signal, 0.0)
        window = self._agents.get(agent)
        if window is None:
            window = self._agents[agent] = _Window(cfg.window)
        if len(window) < cfg.min_signals:
            window.add(signal)
            return GateDecision(True, "grown_warming_up", signal, None)
        rank = window.rank(signal)
        window.add(signal)
        if rank < cfg.grow_share:
            return GateDecision(True, "grown_uncertain", signal, rank)
        return GateDecision(False, "skipped_confident", signal, rank)
