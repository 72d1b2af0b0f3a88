"""When is a turn uncertain? Relative to the agent's own recent response trees, by default.

The paper (Appendix C.2.2) inspects the turns that are in the top 10 % on both signals at once:
many leaves and a low best-branch logprob; that rule stays available (``rule: min_rank``).
Absolute thresholds do not carry from one model to another (the bundled 4 M-parameter model never
reaches -5 on its best branch, so a fixed ``max_best_logprob`` flagged every turn), so the
default rule ranks each new tree against the agent's last ``window_trees`` trees:

* ``r_leaves`` = the fraction of the window with at most as many leaves (mid-rank for ties),
  ``r_logprob`` = the fraction with at least as high a best-branch logprob;
* the tree's *uncertainty score* is ``u = r_logprob`` with ``rule: best_logprob`` (the default);
  with ``rule: min_rank``, the paper's, ``u = min(r_leaves, r_logprob)``: high only when both
  ranks are high, i.e. "in the top on both". The leaf count is measured to point the wrong way
  (many leaves go with success) on both bases studied, and the min() dilutes the signal that works
  (``docs/alert-evaluation.md``);
* it is flagged when ``u`` is above the window's ``1 - target_rate`` quantile of ``u``, so the
  flag rate tracks ``target_rate`` on stationary traffic whatever the model's scale. Ties at the
  threshold (frequent: many trees share a leaf count) are broken by a hash of the turn's key,
  deterministically, in the proportion that keeps the rate.

Until an agent has ``min_trees`` trees nothing is flagged (there is no distribution yet). The
window is per process and starts empty after a restart. ``mode: fixed`` applies
``min_leaves``/``max_best_logprob`` instead.
"""

from __future__ import annotations

import hashlib
from collections import deque
from dataclasses import dataclass

import numpy as np

from sidecar.alerting.config import UncertaintyPolicyConfig


@dataclass(frozen=True, slots=True)
class UncertaintyVerdict:
    uncertain: bool
    score: float | None  # u in [0, 1]; None in fixed mode or before min_trees
    threshold: float | None
    rule: str  # "relative", "fixed" or "warming_up"


def _unit(key: str) -> float:
    return int.from_bytes(hashlib.sha256(key.encode("utf-8")).digest()[:8], "big") / 2.0**64


def _ranks(values: np.ndarray, x: np.ndarray) -> np.ndarray:
    """For each of ``x``: fraction of ``values`` below it plus half of those equal (mid-rank)."""
    s = np.sort(values)
    below = np.searchsorted(s, x, side="left")
    upto = np.searchsorted(s, x, side="right")
    return (below + 0.5 * (upto - below)) / len(s)


class AgentTrees:
    """One agent's recent trees: (leaves, best-branch logprob), bounded."""

    def __init__(self, window: int) -> None:
        self._leaves: deque[float] = deque(maxlen=window)
        self._logprob: deque[float] = deque(maxlen=window)

    def __len__(self) -> int:
        return len(self._leaves)

    def add(self, leaves: int, logprob: float) -> None:
        self._leaves.append(float(leaves))
        self._logprob.append(logprob)

    def scores(self, leaves: int, logprob: float, rule: str = "best_logprob") -> tuple[float, np.ndarray]:
        """The new tree's score and the scores of the window's trees, against the window."""
        lp = np.fromiter(self._logprob, dtype=np.float64, count=len(self._logprob))
        # Low best-branch logprob is the uncertain end: rank the negated values.
        window = _ranks(-lp, -lp)
        new = float(_ranks(-lp, np.array([-logprob]))[0])
        if rule == "min_rank":
            lv = np.fromiter(self._leaves, dtype=np.float64, count=len(self._leaves))
            window = np.minimum(_ranks(lv, lv), window)
            new = min(float(_ranks(lv, np.array([leaves]))[0]), new)
        return new, window


class UncertaintyJudge:
    """Flags uncertain turns per agent (see the module docstring). Not thread-safe: one event loop."""

    def __init__(self) -> None:
        self._agents: dict[str, AgentTrees] = {}

    def judge(
        self, cfg: UncertaintyPolicyConfig, agent: str, key: str, leaves: int, best_logprob: float | None
    ) -> UncertaintyVerdict:
        """Decide for one tree, then add it to the agent's window."""
        if cfg.mode == "fixed":
            uncertain = leaves >= cfg.min_leaves or (best_logprob is not None and best_logprob < cfg.max_best_logprob)
            return UncertaintyVerdict(uncertain, None, None, "fixed")
        if best_logprob is None:
            return UncertaintyVerdict(False, None, None, "no_branch")
        trees = self._agents.setdefault(agent, AgentTrees(cfg.window_trees))
        if len(trees) < cfg.min_trees:
            trees.add(leaves, best_logprob)
            return UncertaintyVerdict(False, None, None, "warming_up")
        score, window = trees.scores(leaves, best_logprob, cfg.rule)
        trees.add(leaves, best_logprob)
        threshold = float(np.quantile(window, 1.0 - cfg.target_rate, method="higher"))
        above = float(np.mean(window > threshold))
        at = float(np.mean(window == threshold))
        if score > threshold:
            uncertain = True
        elif score == threshold and at > 0:
            # Of the trees tied at the threshold, flag the share that brings the rate to the target.
            uncertain = _unit(key) < max(0.0, cfg.target_rate - above) / at
        else:
            uncertain = False
        return UncertaintyVerdict(uncertain, score, threshold, "relative")
