"""Drift: how far an agent's live final verdicts have moved from its adapter's validation baseline.

An adapter is validated once, on a held-back slice of the agent's own conversations; the agent
then changes (new tools, new users, another prompt) and nothing in the adapter's answers says so.
Each agent's last ``scoring.drift.window_verdicts`` *final* verdicts (one per ended conversation,
the same unit as the validation's whole held-back conversations; per-turn verdicts mix in every
unfinished prefix and would drift by construction) are compared with the baseline, per signal:

- ``p_end``: the Kolmogorov-Smirnov distance (0..1) between the window's P(end) values and the
  baseline distribution, given as quantiles at evenly spaced levels (linear in between);
- ``completion_rate``: |live share of complete verdicts - baseline share|;
- ``untrusted_share``: |live share of verdicts from an adapter not trusted for the agent
  (:mod:`~sidecar.scoring.trust`) - baseline share|.

The baseline is ``scoring.agents.<name>.baseline``, else the ``baseline`` in the ``validation``
section of the adapter's manifest (``adapters onboard`` writes it). Agents without one are not
tracked. A P(end) that is not a probability (NaN, infinite, outside [0, 1]) never enters a window:
it is counted in ``sidecar_adapter_drift_rejected_total``. Memory is one bounded window per agent
label, and labels are a closed set (:mod:`~sidecar.telemetry.labels`).
"""

from __future__ import annotations

import contextlib
import math
from bisect import bisect_left, bisect_right
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import structlog
from prometheus_client import CollectorRegistry, Counter, Gauge
from pydantic import ValidationError

from sidecar.scoring.config import AgentConfig, DriftBaselineConfig, DriftConfig
from sidecar.scoring.trust import manifest_validation

log = structlog.get_logger()

Signal = Literal["p_end", "completion_rate", "untrusted_share"]
SIGNALS: tuple[Signal, ...] = ("p_end", "completion_rate", "untrusted_share")


def baseline_cdf(x: float, quantiles: Sequence[float], *, left: bool = False) -> float:
    """F(x) of the distribution whose quantile at level i/m is ``quantiles[i]`` (linear in between).

    ``left`` gives the left limit F(x-), which differs where quantiles tie (an atom)."""
    m = len(quantiles) - 1
    j = bisect_left(quantiles, x) if left else bisect_right(quantiles, x)
    if j == 0:
        return 0.0
    if j > m:
        return 1.0
    lo, hi = quantiles[j - 1], quantiles[j]  # lo <= x < hi (x <= hi for the left limit), lo < hi
    return (j - 1 + (x - lo) / (hi - lo)) / m


def ks_distance(sample: Sequence[float], quantiles: Sequence[float]) -> float:
    """sup_x |F_sample(x) - F_baseline(x)|: 0 for the same distribution, 1 for disjoint ones.

    Both CDFs are monotone and the sample's is constant between its points, so the supremum is at a
    sample point or a baseline quantile, from the left or the right. ``sample`` must be non-empty,
    ``quantiles`` at least two non-decreasing values."""
    xs = sorted(sample)
    n = len(xs)
    worst = 0.0
    for x in {*xs, *quantiles}:
        right = abs(bisect_right(xs, x) / n - baseline_cdf(x, quantiles))
        left = abs(bisect_left(xs, x) / n - baseline_cdf(x, quantiles, left=True))
        worst = max(worst, right, left)
    return worst


@dataclass(frozen=True, slots=True)
class Verdict:
    p_end: float
    complete: bool
    untrusted: bool


class DriftWindow:
    """The last ``size`` final verdicts of one agent (a ring buffer: bounded memory)."""

    def __init__(self, size: int) -> None:
        self._verdicts: deque[Verdict] = deque(maxlen=size)

    def __len__(self) -> int:
        return len(self._verdicts)

    def add(self, p_end: float, *, complete: bool, untrusted: bool) -> str | None:
        """Add one verdict; a P(end) that is no probability is refused: the reason is returned."""
        if not isinstance(p_end, int | float) or isinstance(p_end, bool) or not math.isfinite(p_end):
            return "not_finite"
        if not 0.0 <= p_end <= 1.0:
            return "out_of_range"
        self._verdicts.append(Verdict(float(p_end), complete, untrusted))
        return None

    def distances(self, baseline: DriftBaselineConfig) -> dict[Signal, float]:
        """Each signal the baseline has, as a distance (none for an empty window)."""
        n = len(self._verdicts)
        if n == 0:
            return {}
        out: dict[Signal, float] = {}
        if baseline.p_end_quantiles:
            out["p_end"] = ks_distance([v.p_end for v in self._verdicts], baseline.p_end_quantiles)
        if baseline.completion_rate is not None:
            out["completion_rate"] = abs(sum(v.complete for v in self._verdicts) / n - baseline.completion_rate)
        if baseline.untrusted_share is not None:
            out["untrusted_share"] = abs(sum(v.untrusted for v in self._verdicts) / n - baseline.untrusted_share)
        return out


def resolve_baseline(agent: AgentConfig) -> tuple[DriftBaselineConfig | None, str]:
    """The agent's baseline (config first, then its adapter's manifest) and where it came from."""
    if agent.baseline is not None:
        return agent.baseline, "config"
    if agent.adapter is None or agent.adapter_manifest is None:
        return None, "no baseline configured"
    validation, why = manifest_validation(agent.adapter_manifest)
    if validation is None:
        return None, why
    raw = validation.get("baseline")
    if raw is None:
        return None, "no baseline in the manifest"
    try:
        return DriftBaselineConfig.model_validate(raw), "manifest"
    except ValidationError as exc:
        return None, f"invalid baseline in the manifest ({exc.error_count()} errors)"


class DriftMetrics:
    """The drift metric families on one registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.drift = Gauge(
            "sidecar_adapter_drift",
            "Distance of the agent's recent final verdicts from its adapter's validation baseline, by signal: "
            "p_end (Kolmogorov-Smirnov distance of P(end), 0..1), completion_rate and untrusted_share "
            "(absolute difference of shares). Exported once the window holds scoring.drift.min_verdicts verdicts.",
            ["agent", "signal"],
            registry=registry,
        )
        self.window = Gauge(
            "sidecar_adapter_drift_window_verdicts",
            "Final verdicts in the agent's drift window (at most scoring.drift.window_verdicts).",
            ["agent"],
            registry=registry,
        )
        self.rejected = Counter(
            "sidecar_adapter_drift_rejected_total",
            "Verdicts kept out of the drift window because their P(end) is no probability (not_finite, out_of_range).",
            ["agent", "reason"],
            registry=registry,
        )


class DriftTracker:
    """One window per agent label, compared with the baseline of the agent the label stands for.

    A label's baseline is fixed by the first agent seen under it (labels of configured agents are
    their names; ``default`` and ``other`` share ``default_agent``'s settings)."""

    def __init__(self, config: DriftConfig, registry: CollectorRegistry) -> None:
        self.config = config
        self.metrics = DriftMetrics(registry)
        self._windows: dict[str, tuple[DriftWindow, DriftBaselineConfig]] = {}
        self._untracked: set[str] = set()

    def reset(self, label: str) -> None:
        """The agent's route changed: start a new window against the new route's baseline."""
        self._windows.pop(label, None)
        self._untracked.discard(label)
        self.metrics.window.labels(label).set(0)
        for signal in SIGNALS:
            with contextlib.suppress(KeyError):  # a series not exported yet
                self.metrics.drift.remove(label, signal)

    def observe(self, label: str, agent: AgentConfig, *, p_end: float, complete: bool, untrusted: bool) -> None:
        """Record one final verdict of ``label`` and refresh its drift gauges."""
        if not self.config.enabled or label in self._untracked:
            return
        entry = self._windows.get(label)
        if entry is None:
            baseline, where = resolve_baseline(agent)
            log.info("score.drift_baseline", agent=label, tracked=baseline is not None, source=where)
            if baseline is None:
                self._untracked.add(label)
                return
            entry = self._windows[label] = (DriftWindow(self.config.window_verdicts), baseline)
        window, baseline = entry
        refused = window.add(p_end, complete=complete, untrusted=untrusted)
        if refused is not None:
            self.metrics.rejected.labels(label, refused).inc()
            log.warning("score.drift_rejected", agent=label, reason=refused)
            return
        self.metrics.window.labels(label).set(len(window))
        if len(window) < self.config.min_verdicts:
            return
        for signal, value in window.distances(baseline).items():
            self.metrics.drift.labels(label, signal).set(value)
