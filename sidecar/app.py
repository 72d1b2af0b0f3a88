"""Wiring only: build the components from the config and supervise them in one TaskGroup.

The TaskGroup is the :class:`~sidecar.supervision.Supervisor`'s: see :mod:`sidecar.supervision`
for who owns which task and how a task that dies shows on ``/readyz``.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import structlog
from prometheus_client import CollectorRegistry, ProcessCollector

from sidecar.alerting.escalation import Escalations
from sidecar.alerting.feedback import AlertFeedback, FeedbackMetrics
from sidecar.alerting.metrics import AlertMetrics
from sidecar.alerting.thresholds import FeedbackThresholds, ThresholdMetrics
from sidecar.config import SidecarConfig
from sidecar.contract import ConversationHooks
from sidecar.fleet.leadership import Leadership
from sidecar.lifecycle import Component, HealthReporter, stop_requested_early
from sidecar.source.capabilities import check as check_capabilities
from sidecar.source.capabilities import export as export_capabilities
from sidecar.source.capabilities import probe_broker
from sidecar.source.kafka import KafkaEventSource
from sidecar.stage.feedback import FeedbackSink
from sidecar.stage.pipeline import OutcomeSink, PostScoreStage
from sidecar.state.hooks import CompositeHooks, RecordingHooks
from sidecar.supervision import Supervised, Supervisor, stop_all
from sidecar.telemetry.http import HttpServer, PageRoute
from sidecar.telemetry.labels import AgentLabels
from sidecar.telemetry.logging import configure_logging
from sidecar.telemetry.loop_lag import LoopLagMonitor
from sidecar.telemetry.stream_metrics import StreamMetrics

if TYPE_CHECKING:
    from sidecar.alerting.sinks.base import AlertSink
    from sidecar.clustering.live import GoalClusterer
    from sidecar.scoring.hooks import ScoringHooks
    from sidecar.telemetry.overview import Overview
    from sidecar.training_store.sink import TrainingStoreSink
    from sidecar.training_store.topic import KafkaTrainingStoreSink

log = structlog.get_logger(__name__)


# The sidecar holds hundreds of thousands of long-lived container objects (open conversations and
# their messages). With CPython's default gen-0 threshold of 700 allocations, the collector runs
# every few records and each older-generation pass walks that whole heap: measured at 2.5x the
# processing cost per record (tests/bench/bench_stream.py). A larger threshold keeps collections
# rare; ``gc.freeze()`` moves everything allocated at start-up out of the collector's sight.
GC_THRESHOLDS = (50_000, 20, 100)


def tune_gc() -> None:
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


@dataclass
class Assembly:
    """The hook set plus the components it needs started, checked and served."""

    hooks: ConversationHooks
    sinks: list[OutcomeSink] = field(default_factory=list)
    components: list[Component] = field(default_factory=list)
    health: list[HealthReporter] = field(default_factory=list)
    json_routes: dict[str, Callable[[], object]] = field(default_factory=dict)
    page_routes: dict[str, PageRoute] = field(default_factory=dict)
    feedback: FeedbackSink | None = None
    overview: Overview | None = None


def _follow_routes(
    config: SidecarConfig, registry: CollectorRegistry, scoring: ScoringHooks, labels: AgentLabels, out: Assembly
) -> None:
    """Live routing rows over ``scoring.agents`` (``scoring.routing``), followed from their topic."""
    from sidecar.scoring.routes import LiveRoutes, RoutingFollower

    routes = LiveRoutes(config.scoring.agent, registry, labels)
    scoring.follow(routes)
    follower = RoutingFollower(config.scoring.routing, config.kafka, routes, registry)
    out.components.append(follower)
    out.health.append(follower)


def build_hooks(config: SidecarConfig, registry: CollectorRegistry, leadership: Leadership | None = None) -> Assembly:
    """The hook set and post-score sinks the config asks for; the no-op recorder when no scorer is on.
    ``leadership``: who leads the fleet (needed by ``clustering.fleet``)."""
    named: dict[str, ConversationHooks] = {}
    out = Assembly(hooks=RecordingHooks())
    labels = AgentLabels([*config.scoring.agents, *config.alerting.agents])
    goals: GoalClusterer | None = None
    if config.clustering.enabled:
        from sidecar.clustering.live import GoalClusterer

        goals = GoalClusterer(config.clustering, registry, kafka=config.kafka, leadership=leadership)
        out.components.append(goals)
        out.health.append(goals)
        out.json_routes["clusters"] = goals.snapshot
        out.sinks.append(goals)  # final verdicts -> completion rate per goal
    if config.scoring.enabled:
        from sidecar.scoring.hooks import ScoringHooks

        scoring = ScoringHooks.from_config(
            config.scoring, registry, goal_labeler=goals.goal_label if goals else None, agent_labels=labels
        )
        out.components.append(scoring)
        out.health.extend([scoring, scoring.trust])
        if config.scoring.routing.enabled:
            _follow_routes(config, registry, scoring, labels, out)
        named["scoring"] = scoring
    if config.judge.enabled:
        from sidecar.judge.hooks import JudgeHooks

        judge = JudgeHooks(config.judge, registry)
        out.components.append(judge)
        named["judge"] = judge
    if goals is not None:
        named["goals"] = goals
    if named:
        out.hooks = CompositeHooks(named)
    if config.training_store.enabled:
        store = build_training_store(config, registry, labels)
        out.sinks.append(store)
        out.components.append(store)
        out.health.append(store)
    if config.evaluations.enabled:
        from sidecar.evaluations import build_sinks as build_result_sinks

        for result_sink in build_result_sinks(config.evaluations, registry):
            out.sinks.append(result_sink)  # verdicts -> OTLP log records, Langfuse scores, Phoenix annotations
            out.components.append(result_sink)
            out.health.append(result_sink)
    escalations = build_escalations(config, registry, labels)
    _pages(config, registry, escalations, out)
    out.sinks.append(escalations)
    out.components.append(escalations)
    out.health.append(escalations)
    _take_feedback(config, registry, labels, escalations, out)
    return out


def _pages(config: SidecarConfig, registry: CollectorRegistry, escalations: Escalations, out: Assembly) -> None:
    """The operator pages: the overview at ``/`` and, when on, the trees and escalations."""
    from sidecar.telemetry.overview import Overview

    has_tree = None
    if config.tree_view.enabled:
        from sidecar.trees.view import TreeView

        view = TreeView(config.tree_view, include_text=config.alerting.include_text)
        escalations.observe(view.observe)
        out.page_routes.update(view.routes())
        has_tree = view.has
    out.overview = Overview(registry, has_tree=has_tree)
    escalations.observe(out.overview.observe)
    out.components.append(out.overview)


def _take_feedback(
    config: SidecarConfig, registry: CollectorRegistry, labels: AgentLabels, escalations: Escalations, out: Assembly
) -> None:
    """People's feedback: counted, and moving the escalations' thresholds when configured."""
    ledger = None
    if escalations.thresholds is not None and config.alerting.feedback.adapt_thresholds:
        from sidecar.alerting.ledger import FeedbackLedger

        # The judgements live in a compacted topic every replica counts (restarts and replicas agree).
        ledger = FeedbackLedger(config.alerting, config.kafka, escalations.thresholds, labels, registry)
        out.components.append(ledger)
        out.health.append(ledger)
    out.feedback = AlertFeedback(
        config.kafka.group_id,
        FeedbackMetrics(registry),
        labels,
        thresholds=escalations.thresholds,
        alerting=config.alerting,
        ledger=ledger,
    )
    if escalations.thresholds is not None:
        out.health.append(escalations.thresholds)


def build_training_store(
    config: SidecarConfig, registry: CollectorRegistry, labels: AgentLabels
) -> TrainingStoreSink | KafkaTrainingStoreSink:
    """The training store's backend: the fleet's topic, or this pod's directory."""
    redacted = config.state.redaction.enabled
    if config.training_store.backend == "kafka":
        from sidecar.training_store.topic import KafkaTrainingStoreSink

        return KafkaTrainingStoreSink(config.training_store, config.kafka, registry, labels, redacted=redacted)
    from sidecar.training_store.sink import TrainingStoreSink

    return TrainingStoreSink(config.training_store, registry, labels, redacted=redacted)


def build_escalations(config: SidecarConfig, registry: CollectorRegistry, labels: AgentLabels) -> Escalations:
    sinks: list[AlertSink] = []
    if config.alerting.enabled:
        from sidecar.alerting.sinks import build_sinks

        sinks = build_sinks(config.alerting, config.kafka)
    thresholds = FeedbackThresholds(config.alerting.feedback, ThresholdMetrics(registry))
    return Escalations(
        config.alerting,
        sinks,
        AlertMetrics(registry),
        group=config.kafka.group_id,
        agent_label=labels,
        thresholds=thresholds,
    )


async def run_app(
    config: SidecarConfig,
    *,
    hooks: ConversationHooks | None = None,
    ready: asyncio.Event | None = None,
    stop: asyncio.Event | None = None,
    registry: CollectorRegistry | None = None,
) -> None:
    """Run the sidecar until ``stop`` is set (or the task is cancelled), then shut down cleanly."""
    registry = registry or CollectorRegistry()
    ProcessCollector(registry=registry)  # process_resident_memory_bytes & co., for the memory bound
    metrics = StreamMetrics(registry)
    # Before anything is built or served: brokers that cannot give the configured guarantee stop
    # the process here, with one line saying what is missing and which setting accepts less.
    found = await probe_broker(config.kafka)
    check_capabilities(found)
    export_capabilities(found, metrics)
    # Which replica runs the jobs that must run once: the owner of source partition 0.
    leadership = Leadership(registry)
    lag = LoopLagMonitor(registry)
    assembly = build_hooks(config, registry, leadership)
    if hooks is not None:
        assembly.hooks = hooks
    if config.otel.enabled:
        from sidecar.otel import build_doors

        # The OTLP doors write the events topic the source reads; they start before it.
        doors = build_doors(config.otel, config.kafka, registry)
        assembly.components.extend(doors.components)
        assembly.health.extend(doors.health)
    stage = PostScoreStage(
        assembly.sinks, on_sink_error=lambda name: metrics.sink_errors.labels(name).inc(), feedback=assembly.feedback
    )
    source = KafkaEventSource(
        config.kafka, config.state, assembly.hooks, metrics, stage, capabilities=found, leadership=leadership
    )
    stop = stop or asyncio.Event()
    # A fatal task (the source, the loop-lag probe) raising stops the app like a SIGTERM would;
    # running() raises its exception once the shutdown below is done.
    supervisor = Supervisor(on_fatal=stop.set)
    http = HttpServer(
        config.http,
        registry,
        [source, *assembly.health, leadership, supervisor],
        assembly.json_routes,
        page_routes=assembly.page_routes,
        index=assembly.overview.route() if assembly.overview is not None else None,
    )
    if assembly.overview is not None:
        assembly.overview.bind_readiness(http.readiness)
    tune_gc()
    started: list[Component] = []
    # Every background task, the components' own included (they spawn them in start()), lives in
    # the supervisor's TaskGroup from here on.
    async with supervisor.running():
        pipeline: list[Supervised] = []
        try:
            await http.start()
            for component in assembly.components:
                await component.start()
                started.append(component)
            await source.start()
            log.info("sidecar.started", topic=config.kafka.topic, group=config.kafka.group_id, http_ports=http.ports)
            if ready is not None:
                ready.set()
            pipeline.append(supervisor.spawn("kafka-source", source.run, fatal=True))
            pipeline.append(supervisor.spawn("loop-lag", lag.run, fatal=True))
            await stop.wait()
        finally:
            # The source's loops end first; then the source drains and commits while the scorers
            # can still finish effects; then the components, each stopping its own tasks.
            await stop_all(pipeline)
            await source.stop()
            for component in reversed(started):
                await component.stop()
            await http.stop()
            log.info("sidecar.stopped")


def run_forever(config: SidecarConfig, hooks: ConversationHooks | None = None) -> int:
    """``sidecar run``: run until SIGTERM/SIGINT, then stop gracefully (drain, flush, commit).

    ``hooks`` replaces the configured hook set (the fault-injection tests run slow hooks in a
    real process this way)."""
    configure_logging(config.logging, sys.stderr)

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError):
                loop.add_signal_handler(sig, stop.set)
        if stop_requested_early():  # a stop asked for while the process was still starting
            log.info("sidecar.stopped_before_start")
            return
        await run_app(config, stop=stop, hooks=hooks)

    asyncio.run(main())
    return 0
