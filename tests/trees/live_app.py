"""The sidecar's operator pages as the app serves them, with traffic to show.

:func:`assemble` builds the routes with :func:`sidecar.app.build_hooks` (the wiring ``run_app``
uses: tree view, overview, goal clustering's ``/clusters``) and the same :class:`HttpServer`
arguments, without Kafka or vLLM. :func:`populate` then plays an hour of traffic through the real
objects: the completion counter ``sidecar_conversations_ended_total`` per goal, the goals'
published names and sizes, alerts handed to the escalations' observers (the tree view and the
overview), and the overview's sampler at a fake clock. Used by the Chromium test and by
``python -m tests.bench.page_screenshots``.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

from prometheus_client import CollectorRegistry

from sidecar.alerting.alert import Alert
from sidecar.alerting.escalation import Escalations
from sidecar.app import Assembly, build_hooks
from sidecar.clustering.live import GoalClusterer
from sidecar.config import SidecarConfig
from sidecar.scoring.metrics import ScoringMetrics
from sidecar.telemetry.config import HttpConfig
from sidecar.telemetry.http import HttpServer
from sidecar.telemetry.overview import MAX_POINTS, SAMPLE_SECONDS
from tests.alerting.alerts import make_alert
from tests.trees import trees
from tests.trees.test_view import tree_effect

GOALS = (
    ("g-1a2b", "book a restaurant table", 0.82),
    ("g-3c4d", "change a train ticket", 0.64),
    ("g-5e6f", "find a hotel near the venue", 0.47),
)
HOSTILE_GOAL = ("g-bad0", "<script>alert('goal')</script>\u202eevil", 0.3)


@dataclass
class Live:
    config: SidecarConfig
    registry: CollectorRegistry
    assembly: Assembly
    hostile: Alert
    big: Alert

    def server(self) -> HttpServer:
        """The HTTP server ``run_app`` would start (one listener on a free loopback port)."""
        a = self.assembly
        assert a.overview is not None
        http = HttpServer(
            HttpConfig(host="127.0.0.1", port=0),
            self.registry,
            a.health,
            a.json_routes,
            page_routes=a.page_routes,
            index=a.overview.route(),
        )
        a.overview.bind_readiness(http.readiness)
        return http


class FakeClock:
    def __init__(self, start: float) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now


def assemble(clock: FakeClock) -> Live:
    config = SidecarConfig.model_validate(
        {"scoring": {"enabled": False}, "clustering": {"enabled": True}, "alerting": {"include_text": True}}
    )
    registry = CollectorRegistry()
    assembly = build_hooks(config, registry)
    assert assembly.overview is not None
    # The sampler's clock: an hour of points in no time, from a start an hour ago.
    assembly.overview._clock = clock
    assembly.overview._started = clock.now
    assembly.overview._points.clear()
    assembly.overview.sample()
    return Live(config, registry, assembly, make_alert(1), make_alert(2))


def escalations(assembly: Assembly) -> Escalations:
    [found] = [s for s in assembly.sinks if isinstance(s, Escalations)]
    return found


def _goals(assembly: Assembly) -> GoalClusterer:
    route = assembly.json_routes["clusters"]
    owner = getattr(route, "__self__", None)
    assert isinstance(owner, GoalClusterer)
    return owner


def populate(live: Live, clock: FakeClock, *, hostile: bool = True, seed: int = 3) -> None:
    """An hour of conversations, goals and alerts, sampled every ``SAMPLE_SECONDS``."""
    rng = random.Random(seed)
    a = live.assembly
    assert a.overview is not None
    ended = ScoringMetrics(live.registry).conversations_ended
    goals = [*GOALS, HOSTILE_GOAL] if hostile else list(GOALS)
    clustering = _goals(a).metrics
    for gid, name, _ in goals:
        clustering.goal_info.labels(gid, name).set(1)
        clustering.cluster_size.labels(gid).set(rng.randint(40, 400))
    observers = escalations(a)._observers
    kinds = ("uncertain_turn", "conversation_incomplete", "conversation_stalled")
    n = 10
    for step in range(MAX_POINTS):
        clock.now += SAMPLE_SECONDS
        drift = 0.15 * (step / MAX_POINTS)
        for gid, _, rate in goals:
            for _ in range(rng.randint(0, 3)):
                outcome = "complete" if rng.random() < rate - drift * (gid == "g-3c4d") else "incomplete"
                ended.labels("support-bot", outcome, gid).inc()
        if rng.random() < 0.25:
            n += 1
            kind = rng.choice(kinds)
            alert = make_alert(n, kind=kind, created_at_unix=clock.now, summary=f"{kind.replace('_', ' ')} #{n}")
            effect = tree_effect(f"c{n}", trees.many_leaves(12, seed=n) if kind == "uncertain_turn" else [])
            for observe in observers:
                observe(alert, effect)
        a.overview.sample()
    # The two trees the tests open: a large one and one full of hostile text.
    live.big = make_alert(
        900,
        created_at_unix=clock.now,
        summary="Uncertain turn: 60 leaves, best branch logprob -0.5",
        details={"leaves": 60, "max_logprob": -0.5, "threshold": -5.0, "mode": "fixed"},
    )
    for observe in observers:
        observe(live.big, tree_effect("c-big", trees.many_leaves(60)))
    if hostile:
        live.hostile = make_alert(901, created_at_unix=clock.now, summary="<script>alert('summary')</script>")
        for observe in observers:
            observe(live.hostile, tree_effect("c-hostile", trees.hostile()))


def live_app(*, hostile: bool = True) -> Live:
    clock = FakeClock(time.time() - MAX_POINTS * SAMPLE_SECONDS)
    live = assemble(clock)
    populate(live, clock, hostile=hostile)
    clock.now = time.time()
    return live
