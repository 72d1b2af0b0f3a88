"""The figures ``sidecar demo`` shows, read by name from the sidecar's own metrics registry.

One :func:`read_figures` call takes a consistent snapshot (one ``collect()``) of the metrics that
tell the demo's story, each named here explicitly: events in and lag, conversations open and
ended, completion verdicts, trees and uncertain turns, alerts by kind and sink, goals with their
completion rate, and scoring latency. The live panel and the final summary render the same
snapshot type, so what the screen shows while running is what the summary shows at the end.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Final

from prometheus_client import CollectorRegistry

EVENTS_IN: Final = "sidecar_events_consumed_total"
LAG: Final = "sidecar_consumer_lag_records"
OPEN: Final = "sidecar_conversations_active"
FINALISED: Final = "sidecar_conversations_finalised_total"
VERDICTS: Final = "sidecar_completion_scored_total"
FINAL_VERDICTS: Final = "sidecar_conversations_ended_total"
TREES: Final = "sidecar_tree_leaves"  # a histogram: its count is the number of trees built
UNCERTAIN: Final = "sidecar_uncertain_turns_total"
ALERTS: Final = "sidecar_alerts_total"
GOAL_INFO: Final = "sidecar_goal_info"
GOAL_SIZE: Final = "sidecar_clustering_goal_conversations"
CLUSTERS: Final = "sidecar_clustering_clusters"
LATENCY: Final = "sidecar_scoring_duration_seconds"
UNNAMED: Final = "unnamed"  # the name label of a goal too small to be named yet
# The sample names read; everything else in the registry is ignored.
_WANTED: Final = frozenset(
    {
        EVENTS_IN,
        LAG,
        OPEN,
        FINALISED,
        VERDICTS,
        FINAL_VERDICTS,
        TREES + "_count",
        UNCERTAIN,
        ALERTS,
        GOAL_INFO,
        GOAL_SIZE,
        CLUSTERS,
        LATENCY + "_bucket",
    }
)

Labels = Mapping[str, str]


@dataclass(frozen=True, slots=True)
class Goal:
    """One live goal cluster: its id, published name (empty while unnamed), size and outcomes."""

    goal: str
    name: str
    conversations: int
    complete: int
    incomplete: int

    @property
    def completion_rate(self) -> float | None:
        """Complete / (complete + incomplete) over its ended conversations; None before any."""
        judged = self.complete + self.incomplete
        return self.complete / judged if judged else None


@dataclass(frozen=True, slots=True)
class Latency:
    """Scoring latency of one kind (completion, tree), estimated from histogram buckets."""

    kind: str
    count: int
    p50_seconds: float
    p95_seconds: float


@dataclass(frozen=True, slots=True)
class Figures:
    """One snapshot of what the demo shows. Counts are summed over the labels not shown."""

    events_in: int = 0
    lag_records: int = 0
    conversations_open: int = 0
    conversations_ended: int = 0
    turns_complete: int = 0
    turns_incomplete: int = 0
    final_complete: int = 0
    final_incomplete: int = 0
    trees: int = 0
    uncertain_turns: int = 0
    # (kind, sink) -> alerts delivered; (kind, sink) -> alerts the sink rejected.
    alerts_delivered: Mapping[tuple[str, str], int] = field(default_factory=dict)
    alerts_rejected: Mapping[tuple[str, str], int] = field(default_factory=dict)
    clusters: int = 0
    goals: tuple[Goal, ...] = ()
    latency: tuple[Latency, ...] = ()

    @property
    def alerts(self) -> int:
        return sum(self.alerts_delivered.values())

    @property
    def named_goals(self) -> tuple[Goal, ...]:
        return tuple(g for g in self.goals if g.name and g.name != UNNAMED)


def quantile(q: float, buckets: Iterable[tuple[float, float]]) -> float:
    """Prometheus' ``histogram_quantile``: linear interpolation in cumulative ``(le, count)`` buckets."""
    ordered = sorted(buckets)
    if not ordered or ordered[-1][1] <= 0:
        return math.nan
    rank = q * ordered[-1][1]
    lower_bound, lower_count = 0.0, 0.0
    for bound, count in ordered:
        if count >= rank:
            if math.isinf(bound):
                return lower_bound  # the top bucket has no upper edge: its lower one is the estimate
            if count == lower_count:
                return bound
            return lower_bound + (bound - lower_bound) * (rank - lower_count) / (count - lower_count)
        lower_bound, lower_count = bound, count
    return lower_bound


def read_figures(registry: CollectorRegistry) -> Figures:
    """A snapshot of the demo's figures from ``registry`` (absent metrics read as zero)."""
    samples: dict[str, list[tuple[Labels, float]]] = defaultdict(list)
    for family in registry.collect():
        for s in family.samples:
            if s.name in _WANTED:
                samples[s.name].append((s.labels, s.value))

    def total(name: str, **match: str) -> int:
        return round(sum(v for labels, v in samples[name] if all(labels.get(k) == w for k, w in match.items())))

    delivered: dict[tuple[str, str], int] = defaultdict(int)
    rejected: dict[tuple[str, str], int] = defaultdict(int)
    for labels, value in samples[ALERTS]:
        into = delivered if labels.get("outcome") == "delivered" else rejected
        into[(labels.get("kind", "?"), labels.get("sink", "?"))] += round(value)
    return Figures(
        events_in=total(EVENTS_IN),
        lag_records=total(LAG),
        conversations_open=total(OPEN),
        conversations_ended=total(FINALISED),
        turns_complete=total(VERDICTS, outcome="complete"),
        turns_incomplete=total(VERDICTS, outcome="incomplete"),
        final_complete=total(FINAL_VERDICTS, outcome="complete"),
        final_incomplete=total(FINAL_VERDICTS, outcome="incomplete"),
        trees=total(TREES + "_count"),
        uncertain_turns=total(UNCERTAIN),
        alerts_delivered=dict(delivered),
        alerts_rejected={k: v for k, v in rejected.items() if v},
        clusters=total(CLUSTERS),
        goals=_goals(samples),
        latency=_latency(samples[LATENCY + "_bucket"]),
    )


def _goals(samples: Mapping[str, list[tuple[Labels, float]]]) -> tuple[Goal, ...]:
    names = {labels["goal"]: labels.get("name", "") for labels, v in samples[GOAL_INFO] if v and "goal" in labels}
    sizes = {labels["goal"]: round(v) for labels, v in samples[GOAL_SIZE] if "goal" in labels}
    outcomes: dict[tuple[str, str], int] = defaultdict(int)
    for labels, value in samples[FINAL_VERDICTS]:
        outcomes[(labels.get("goal", ""), labels.get("outcome", ""))] += round(value)
    goals = [
        Goal(g, names.get(g, ""), sizes.get(g, 0), outcomes[(g, "complete")], outcomes[(g, "incomplete")])
        for g in names.keys() | sizes.keys()
        if g not in ("other", "unknown")
    ]
    return tuple(sorted(goals, key=lambda g: (-g.conversations, g.goal)))


def _latency(buckets: Iterable[tuple[Labels, float]]) -> tuple[Latency, ...]:
    by_kind: dict[str, dict[float, float]] = defaultdict(lambda: defaultdict(float))
    for labels, value in buckets:
        by_kind[labels.get("kind", "?")][float(labels.get("le", "+Inf"))] += value
    out = []
    for kind, cumulative in sorted(by_kind.items()):
        count = round(cumulative.get(math.inf, 0.0))
        if count:
            pairs = list(cumulative.items())
            out.append(Latency(kind, count, quantile(0.5, pairs), quantile(0.95, pairs)))
    return tuple(out)


__all__ = ["Figures", "Goal", "Latency", "quantile", "read_figures"]
