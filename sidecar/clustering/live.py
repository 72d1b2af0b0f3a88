"""Goal clusters kept live in the sidecar: the one object the application wires.

:class:`GoalClusterer` is what the rest of the service sees of goal clustering: a component
(start/stop/health), a hook set (the end hook assigns each ended conversation to a goal), a
post-score sink (final completion verdicts feed the rate per goal), the goal labeler of metrics and
alerts, and the ``GET /clusters`` snapshot. It only composes the pieces that do the work:

* :class:`~sidecar.clustering.model.GoalModel`: the live clusters, their stable ids and names, the
  nearest-centroid assignment and the bounded goal values on metrics;
* :class:`~sidecar.clustering.completion_rate.CompletionRates`: completion counts per cluster;
* :class:`~sidecar.clustering.scheduler.ReclusterScheduler`: the reservoir sample, when to
  re-cluster (first, on schedule, on drift) and the run of Algorithm 1.

Each ended conversation is summarised (instruct model, or the user's own words in the LLM-free
mode), embedded off the event loop in batches, offered to the reservoir and assigned to the nearest
live cluster. The end hook and :meth:`GoalClusterer.goal_label` share that work per conversation id.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Awaitable
from typing import Any

import numpy as np
import structlog
from prometheus_client import CollectorRegistry

from sidecar.clustering.algorithm import ClusteringResult, assign_nearest
from sidecar.clustering.completion_rate import CompletionRates
from sidecar.clustering.config import ClusteringConfig
from sidecar.clustering.embed import EmbedBatcher, Embedder, Matrix, build_embedder
from sidecar.clustering.fleet import MODEL_KEY, FleetGoals
from sidecar.clustering.llm import ExtractiveGoalLLM, GoalLLM, OpenAIGoalLLM, extractive_summary
from sidecar.clustering.metrics import ClusteringMetrics
from sidecar.clustering.model import OTHER, UNKNOWN, GoalModel
from sidecar.clustering.records import FleetGoalModel, GoalInput, Published
from sidecar.clustering.reservoir import Reservoir, ReservoirItem
from sidecar.clustering.scheduler import ReclusterScheduler
from sidecar.contract import CompletionScored, Effect, GoalAssigned, HookResult, Outcome, Scored, TurnContext
from sidecar.fleet.leadership import Leadership
from sidecar.lifecycle import Health
from sidecar.source.config import KafkaConfig

log = structlog.get_logger()

# The goal values this facade hands out besides cluster ids (defined with the model).
__all__ = ["OTHER", "UNKNOWN", "GoalClusterer"]


async def _const(value: str) -> str:
    return value


class GoalClusterer:
    """Component + ``ConversationHooks`` + post-score sink + goal labeler over the live goal model."""

    name = "goals"

    def __init__(
        self,
        config: ClusteringConfig,
        registry: CollectorRegistry,
        *,
        llm: GoalLLM | None = None,
        embedder: Embedder | None = None,
        kafka: KafkaConfig | None = None,
        leadership: Leadership | None = None,
    ) -> None:
        """``kafka`` and ``leadership`` are needed with ``clustering.fleet.enabled`` (one goal model
        for the fleet, :mod:`sidecar.clustering.fleet`)."""
        self._cfg = config
        self.metrics = ClusteringMetrics(registry)
        self._llm = llm if llm is not None else self._default_llm(config)
        embedder = embedder if embedder is not None else build_embedder(config.embedding)
        self._batcher = EmbedBatcher(embedder, max_batch=config.embedding.batch_size)
        self._reservoir = Reservoir(config.reservoir_size, seed=config.seed)
        self.model = GoalModel(config)
        self.completion = CompletionRates(config.assignment_cache_size, self._reservoir)
        self.fleet: FleetGoals | None = None
        if config.fleet.enabled:
            if kafka is None or leadership is None:
                raise ValueError("clustering.fleet needs the Kafka config and the fleet's leadership")
            self.fleet = FleetGoals(
                config, kafka, registry, leadership, on_input=self._fleet_input, on_model=self._fleet_model
            )
        fleet = self.fleet
        self.scheduler = ReclusterScheduler(
            config,
            self.metrics,
            model=self.model,
            completion=self.completion,
            reservoir=self._reservoir,
            llm=self._llm,
            embedder=embedder,
            publish=None if fleet is None else self._publish_fleet_model,
            may_run=None if fleet is None else (lambda: fleet.leading),
        )
        self._pending: OrderedDict[str, asyncio.Future[str | None]] = OrderedDict()
        self._dimension: int | None = None  # of this replica's embeddings, once it made one

    def _default_llm(self, config: ClusteringConfig) -> GoalLLM:
        if config.mode == "llm":
            return OpenAIGoalLLM(config, self.metrics)
        return ExtractiveGoalLLM(config)

    # ---------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        if self._cfg.enabled:
            if self.fleet is not None:
                await self.fleet.start()
            await self.scheduler.start()

    async def stop(self) -> None:
        await self.scheduler.stop()
        if self.fleet is not None:
            await self.fleet.stop()
        await self._batcher.stop()
        aclose = getattr(self._llm, "aclose", None)
        if aclose is not None:
            await aclose()

    def health(self) -> Health:
        if not self._cfg.enabled:
            return Health("clustering", True, "disabled")
        detail = f"{len(self.model)} clusters, {len(self._reservoir)} in reservoir"
        if self.scheduler.last_error:
            detail += f", last error: {self.scheduler.last_error}"
        if self.fleet is not None:
            detail += f"; fleet: {'leader' if self.fleet.leading else 'follower'}, {self.fleet.health().detail}"
        return Health("clustering", not self.scheduler.crashed, detail)

    # ---------------------------------------------------------------- hooks

    # Per-message hooks have nothing to do: an outcome returned synchronously costs no task.
    def on_user_message(self, ctx: TurnContext) -> HookResult:
        del ctx
        return {}

    def on_turn_closed(self, ctx: TurnContext) -> HookResult:
        del ctx
        return {}

    def on_conversation_ended(self, ctx: TurnContext) -> HookResult:
        if not self._cfg.enabled:
            return {}
        fut = self._assignment(ctx)

        async def outcome() -> Outcome:
            cid = await fut
            goal = self.model.goal_of(cid)
            return Scored({"goal_id": cid, "goal": goal}, [GoalAssigned(goal)])

        return outcome()

    # ---------------------------------------------------------------- post-score stage

    def offer(self, effect: Effect) -> None:
        """Final completion verdicts feed the completion rate per goal (a post-score sink)."""
        final = effect.first(CompletionScored)
        if effect.ctx.kind == "conversation_ended" and isinstance(final, CompletionScored) and final.final:
            self.record_outcome(effect.ctx.conversation_id, final.complete)

    def goal_label(self, ctx: TurnContext) -> Awaitable[str]:
        """The goal value on metrics of an ended conversation: a stable id, other or unknown (shares
        work with the end hook)."""
        if not self._cfg.enabled:
            return _const(UNKNOWN)
        fut = self._assignment(ctx)

        async def label() -> str:
            return self.model.goal_of(await fut)

        return label()

    def record_outcome(self, conversation_id: str, complete: bool | None) -> None:
        """The completion verdict of a conversation, in either order relative to its assignment."""
        self.completion.record_outcome(conversation_id, complete)

    async def recluster(self, trigger: str = "manual") -> bool:
        """Re-cluster now (see :meth:`ReclusterScheduler.recluster`); False if skipped/failed."""
        return await self.scheduler.recluster(trigger)

    # ---------------------------------------------------------------- snapshot

    def snapshot(self) -> dict[str, Any]:
        """What ``GET /clusters`` serves: clusters largest first, with labels, sizes, rates."""
        return {
            "enabled": self._cfg.enabled,
            "mode": self._cfg.mode,
            "reservoir_conversations": len(self._reservoir),
            "runs": self.scheduler.runs,
            "fleet": self._fleet_snapshot(),
            "last_run": dict(self.scheduler.last_run),
            "clusters": [info.as_json(*self.completion.counts(info.id)) for info in self.model.clusters()],
        }

    # ---------------------------------------------------------------- per conversation

    def _assignment(self, ctx: TurnContext) -> asyncio.Future[str | None]:
        fut = self._pending.get(ctx.conversation_id)
        if fut is None or (fut.done() and (fut.cancelled() or fut.exception() is not None)):
            fut = asyncio.ensure_future(self._assign(ctx))
            self._pending[ctx.conversation_id] = fut
            while len(self._pending) > self._cfg.assignment_cache_size:
                self._pending.popitem(last=False)
        return fut

    async def _assign(self, ctx: TurnContext) -> str | None:
        if not any(m.role == "user" and m.content.strip() for m in ctx.messages):
            self.metrics.assignments.labels("error").inc()
            return None
        try:
            summary = await self._llm.summarize(ctx.messages)
        except Exception as exc:  # an unreachable LLM must not cost the label: use the user's words
            log.info("clustering.summary_fallback", error=type(exc).__name__)
            summary = extractive_summary(ctx.messages, self._cfg.max_summary_chars)
        try:
            vec = await self._batcher.embed_one(summary)
        except Exception as exc:  # an embedding failure must cost one label, never the hook
            self.metrics.assignments.labels("error").inc()
            log.warning("clustering.embed_failed", error=type(exc).__name__)
            return None
        self._dimension = int(vec.shape[0])
        if self.fleet is not None:  # every replica's reservoir takes it from the inputs topic
            self.fleet.write_input(GoalInput(ctx.conversation_id, summary, vec))
        else:
            self.scheduler.offer(ReservoirItem(ctx.conversation_id, summary, vec))
        cid = self._nearest(vec)
        self.completion.assigned(ctx.conversation_id, cid)
        return cid

    def _nearest(self, vec: Matrix) -> str | None:
        if len(self.model) and self.model.centroids().shape[1] != vec.shape[0]:
            self.metrics.assignments.labels("unclustered").inc()  # a model of another embedding
            return None
        hit = self.model.nearest(vec)
        if hit is None:
            self.metrics.assignments.labels("unclustered").inc()
            return None
        cid, distance = hit
        self.metrics.assignments.labels("assigned").inc()
        self.scheduler.observe_distance(distance)
        return cid

    # ---------------------------------------------------------------- the fleet's model

    def _fleet_input(self, item: GoalInput) -> None:
        """An input read from the topic; one of another dimension than this replica's embeddings is
        refused (before this replica embedded anything, a run keeps the most common dimension)."""
        if self._dimension is not None and item.vector.shape[0] != self._dimension:
            assert self.fleet is not None
            self.fleet.metrics.inputs.labels("invalid").inc()
            return
        self.scheduler.offer(ReservoirItem(item.conversation_id, item.summary, item.vector))

    async def _publish_fleet_model(self, result: ClusteringResult) -> Published:
        assert self.fleet is not None
        return await self.fleet.publish_model(self.model.plan(result))

    def _fleet_model(self, model: FleetGoalModel) -> None:
        """A fleet model read from the topic (every replica, the leader too): the live clusters."""
        items = self._reservoir.items()
        dims = {c.centroid.shape[0] for c in model.clusters}
        if items and dims and dims != {items[0].vector.shape[0]}:
            log.error("clustering.fleet_model_refused", reason="embedding dimensions differ", model=sorted(dims))
            return
        ids = self.model.load(model)
        sample: list[tuple[str, bool | None]] = []
        if items and ids:
            rows, _ = assign_nearest(np.stack([it.vector for it in items]), self.model.centroids())
            sample = [(ids[int(r)], it.complete) for r, it in zip(rows.tolist(), items, strict=True)]
        self.completion.restart(ids, sample)
        self.model.publish(self.metrics)
        log.info("clustering.fleet_model_applied", generation=model.generation, version=model.version, goals=len(ids))

    def _fleet_snapshot(self) -> dict[str, Any] | None:
        if self.fleet is None:
            return None
        model = self.fleet.table.get(MODEL_KEY)
        return {
            "leader": self.fleet.leading,
            "model_generation": None if model is None else model.generation,
            "model_version": None if model is None else model.version,
        }
