"""The overview page at ``GET /`` of the operator listener: what this process has seen, in one page.

Served from the process's own state, with no external service:

* a ring of :data:`MAX_POINTS` points, one every :data:`SAMPLE_SECONDS` (the last hour), each
  holding the cumulative counts of ``sidecar_conversations_ended_total`` (complete and judged
  conversations, overall and per goal) and of the alerts decided by kind. The counters are read
  through a registry restricted to the metric families needed (a few label sets, not the whole
  registry), by a supervised task (``overview-sampler``) that does nothing else;
* the last :data:`RECENT_ALERTS` alerts decided (:meth:`Overview.observe` is an alert observer
  of :class:`~sidecar.alerting.escalation.Escalations`), linked to their trees while the tree view
  keeps them;
* goals with their published names and sizes (``sidecar_goal_info``,
  ``sidecar_clustering_goal_conversations``);
* readiness, the same checks ``/readyz`` answers with, each in words.

Every series is bounded: goals beyond :data:`MAX_GOALS` (by conversations judged) are not
plotted, alert kinds are the closed set :data:`~sidecar.alerting.alert.ALERT_KINDS`. Rendering a
page walks at most ``MAX_POINTS`` points per series. Nothing survives a restart.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from prometheus_client import CollectorRegistry

from sidecar.alerting.alert import ALERT_KINDS, Alert
from sidecar.contract import Effect
from sidecar.supervision import Supervised, spawn
from sidecar.telemetry.http import Page, PageRoute
from sidecar.trees.overview_page import Check, Goal, OverviewData, Series, overview_page
from sidecar.trees.pages import Escalation

SAMPLE_SECONDS: Final = 15.0
MAX_POINTS: Final = 240  # one hour at SAMPLE_SECONDS
RATE_WINDOW_SECONDS: Final = 300.0  # a completion rate point: conversations judged in the last 5 minutes
RECENT_ALERTS: Final = 10
MAX_GOALS: Final = 8
MAX_GOAL_LABEL_CHARS: Final = 120
ALL: Final = ""  # the key of the overall counts
_ENDED: Final = "sidecar_conversations_ended_total"
_GOAL_INFO: Final = "sidecar_goal_info"
_GOAL_SIZE: Final = "sidecar_clustering_goal_conversations"
_JUDGED: Final = frozenset({"complete", "incomplete"})
# The goal label's two values that are not a goal (sidecar.clustering.model's OTHER and UNKNOWN).
SPECIAL_GOALS: Final = {"unknown": "(no goal assigned yet)", "other": "(other goals, past the top N)"}

Readiness = Callable[[], Mapping[str, Any]]


@dataclass(frozen=True, slots=True)
class Point:
    """Cumulative counts at ``at`` (unix seconds): per goal (``ALL`` overall) ``(complete, judged)``
    conversations, and alerts decided per kind."""

    at: float
    ended: Mapping[str, tuple[float, float]]
    alerts: Mapping[str, int]


class Overview:
    """The state behind ``GET /``; an alert observer and a :class:`~sidecar.lifecycle.Component`."""

    def __init__(
        self,
        registry: CollectorRegistry,
        *,
        has_tree: Callable[[str], bool] | None = None,
        sample_seconds: float = SAMPLE_SECONDS,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if sample_seconds <= 0:
            raise ValueError("sample_seconds must be positive")
        self._metrics = registry.restricted_registry([_ENDED, _GOAL_INFO, _GOAL_SIZE])
        self._has_tree = has_tree or (lambda _id: False)
        self._interval = sample_seconds
        self._clock = clock
        self._alerts: dict[str, int] = dict.fromkeys(ALERT_KINDS, 0)
        self._recent: deque[Escalation] = deque(maxlen=RECENT_ALERTS)
        self._points: deque[Point] = deque(maxlen=MAX_POINTS)
        self._readiness: Readiness = dict
        self._started = clock()
        self._task: Supervised | None = None
        self.sample()

    # -- feeding ---------------------------------------------------------------------------------

    def bind_readiness(self, readiness: Readiness) -> None:
        """Where the checks come from: :meth:`HttpServer.readiness
        <sidecar.telemetry.http.HttpServer.readiness>` (set once the server exists)."""
        self._readiness = readiness

    def observe(self, alert: Alert, _effect: Effect) -> None:
        """Count ``alert`` by kind and keep it among the latest (text never kept here)."""
        if alert.kind in self._alerts:
            self._alerts[alert.kind] += 1
        self._recent.append(Escalation.of(alert, None))

    def sample(self) -> Point:
        """Read the counters now and append a point to the ring."""
        point = Point(self._clock(), self._ended(), dict(self._alerts))
        self._points.append(point)
        return point

    def _ended(self) -> dict[str, tuple[float, float]]:
        """``(complete, judged)`` conversations per goal (``ALL``: overall), read now."""
        ended: dict[str, list[float]] = {ALL: [0.0, 0.0]}
        for metric in self._metrics.collect():
            if metric.name != _ENDED.removesuffix("_total"):
                continue
            for s in metric.samples:
                if s.name != _ENDED or s.labels.get("outcome") not in _JUDGED:
                    continue
                done = 1.0 if s.labels["outcome"] == "complete" else 0.0
                for key in (ALL, str(s.labels.get("goal", ""))[:MAX_GOAL_LABEL_CHARS]):
                    counts = ended.setdefault(key, [0.0, 0.0])
                    counts[0] += done * s.value
                    counts[1] += s.value
        return {k: (c, n) for k, (c, n) in ended.items()}

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            self.sample()

    async def start(self) -> None:
        if self._task is None:
            self._task = spawn("overview-sampler", self._run)

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            await task.stop()

    # -- reading ---------------------------------------------------------------------------------

    def points(self) -> list[Point]:
        return list(self._points)

    def _goals(self, ended: Mapping[str, tuple[float, float]]) -> list[Goal]:
        names: dict[str, str] = {}
        sizes: dict[str, float] = {}
        for metric in self._metrics.collect():
            for s in metric.samples:
                goal = str(s.labels.get("goal", ""))[:MAX_GOAL_LABEL_CHARS]
                if s.name == _GOAL_INFO and s.value:
                    names[goal] = str(s.labels.get("name", ""))[:200]
                elif s.name == _GOAL_SIZE:
                    sizes[goal] = s.value
        goals = []
        for goal in names.keys() | sizes.keys() | (ended.keys() - {ALL}):
            complete, judged = ended.get(goal, (0.0, 0.0))
            name = names.get(goal, SPECIAL_GOALS.get(goal))
            goals.append(Goal(goal, name, sizes.get(goal), int(judged), complete / judged if judged else None))
        goals.sort(key=lambda g: (-(g.size or 0), -g.judged, g.id))
        return goals

    def _rates(self, points: list[Point], goal: str) -> list[tuple[float, float | None]]:
        """Completion rate of the conversations judged in the ``RATE_WINDOW_SECONDS`` before each point."""
        out: list[tuple[float, float | None]] = []
        j = 0
        for p in points:
            while j + 1 < len(points) and points[j + 1].at <= p.at - RATE_WINDOW_SECONDS:
                j += 1
            base = points[j] if points[j] is not p else None
            c1, n1 = p.ended.get(goal, (0.0, 0.0))
            c0, n0 = base.ended.get(goal, (0.0, 0.0)) if base is not None else (0.0, 0.0)
            out.append((p.at, (c1 - c0) / (n1 - n0) if n1 > n0 else None))
        return out

    def data(self) -> OverviewData:
        """What the page shows, computed now (bounded by the ring's size)."""
        points = [*self._points, Point(self._clock(), self._ended(), dict(self._alerts))]
        goals = self._goals(points[-1].ended)
        plotted = [g for g in sorted(goals, key=lambda g: -g.judged) if g.judged and g.id not in SPECIAL_GOALS]
        plotted = plotted[:MAX_GOALS]
        rates = [Series("all conversations", self._rates(points, ALL))]
        shown = [g.name or g.id for g in plotted]
        # A name two goals share (e.g. "unnamed" before naming) gets the goal's id beside it.
        shown = [f"{n} ({g.id})" if shown.count(n) > 1 else n for n, g in zip(shown, plotted, strict=True)]
        rates += [Series(n, self._rates(points, g.id)) for n, g in zip(shown, plotted, strict=True)]
        alerts = [Series(kind, [(p.at, float(p.alerts.get(kind, 0))) for p in points]) for kind in ALERT_KINDS]
        body = self._readiness()
        checks = [
            Check(str(c.get("name", "")), bool(c.get("ready")), bool(c.get("gates")), str(c.get("detail") or ""))
            for c in body.get("checks", [])
            if isinstance(c, Mapping)
        ]
        recent = list(reversed(self._recent))
        return OverviewData(
            now=points[-1].at,
            started=self._started,
            ready=bool(body.get("ready", False)),
            checks=checks,
            completion=rates,
            alerts=alerts,
            alert_totals=dict(self._alerts),
            goals=goals,
            recent=recent,
            with_tree={e.id for e in recent if self._has_tree(e.id)},
            sample_seconds=self._interval,
        )

    def page(self, _param: str | None) -> Page:
        return Page(overview_page(self.data()))

    def route(self) -> PageRoute:
        """The route to give :class:`~sidecar.telemetry.http.HttpServer` as its ``index``."""
        return PageRoute(self.page, audit="operator.overview_viewed")


__all__ = ["MAX_POINTS", "SAMPLE_SECONDS", "Overview", "Point"]
