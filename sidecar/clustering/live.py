"""Goal clusters kept live in the sidecar.

Each ended conversation is summarised (instruct model, or the user's own words in the LLM-free
mode), embedded off the event loop, assigned to the nearest live cluster and offered to a bounded
:class:`~sidecar.clustering.reservoir.Reservoir`. Algorithm 1 re-runs on the reservoir on a
schedule, early when drift is seen (the running mean distance of new conversations to their
centroid exceeds ``drift_ratio`` x the distance measured at the last run), and first as soon as
``min_conversations`` are held. k-means and embeddings run in worker threads; the LLM calls are
awaited; the event loop never blocks. New clusters take the ids of the old ones they match
(:class:`~sidecar.clustering.ids.ClusterIdRegistry`).

The goal value on metrics (:meth:`GoalClusterer.goal_label`) is a stable cluster id, never text:
the ids of the ``top_n_labels`` largest clusters, ``other`` for the rest, ``unknown`` before the
first clustering or when a conversation could not be summarised or embedded. A re-clustering that
renames a goal keeps its id, so its series continue. Names are published beside the ids, in
``sidecar_goal_info{goal,name}`` and ``GET /clusters``, and only for clusters of at least
``min_conversations_per_name`` conversations (smaller ones are ``unnamed``): one conversation's
words never become a name, whatever wrote the label.

Completion per goal: whoever knows the verdict calls :meth:`GoalClusterer.record_outcome`
(before or after the conversation was assigned; both orders work). A cluster's rate is computed
over the reservoir sample at the last re-clustering plus every outcome recorded since.
"""

from __future__ import annotations

import asyncio
import re
import secrets
import time
from collections import OrderedDict
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any

import numpy as np
import structlog
from prometheus_client import CollectorRegistry

from sidecar.clustering.algorithm import assign_nearest, llm_guided_clustering
from sidecar.clustering.config import ClusteringConfig
from sidecar.clustering.embed import EmbedBatcher, Embedder, Matrix, build_embedder
from sidecar.clustering.ids import ClusterIdRegistry
from sidecar.clustering.llm import ExtractiveGoalLLM, GoalLLM, OpenAIGoalLLM, extractive_summary
from sidecar.clustering.metrics import ClusteringMetrics
from sidecar.clustering.reservoir import Reservoir, ReservoirItem
from sidecar.contract import CompletionScored, Effect, GoalAssigned, HookResult, Outcome, Scored, TurnContext
from sidecar.lifecycle import Health

log = structlog.get_logger()

OTHER = "other"
UNKNOWN = "unknown"
UNNAMED = "unnamed"
_SLUG = re.compile(r"[^a-z0-9 /&+-]+")


def metric_label(text: str, max_chars: int) -> str:
    """A label value safe for Prometheus: lower case, a small alphabet, bounded length."""
    slug = " ".join(_SLUG.sub(" ", text.lower()).split())[:max_chars].strip()
    return slug if slug and slug not in (OTHER, UNKNOWN) else UNNAMED


@dataclass(slots=True)
class ClusterInfo:
    """One live cluster. ``goal`` is its value on metrics (its id, or ``other`` past the top N);
    ``label`` and ``name`` are None/``unnamed`` while it is too small to be named."""

    id: str
    label: str | None
    goal: str
    name: str
    size: int
    complete: int = 0
    incomplete: int = 0
    assigned_since: int = 0

    def as_json(self) -> dict[str, Any]:
        judged = self.complete + self.incomplete
        return {
            "id": self.id,
            "goal": self.goal,
            "name": self.name,
            "label": self.label,
            "size": self.size,
            "assigned_since_clustering": self.assigned_since,
            "complete": self.complete,
            "incomplete": self.incomplete,
            "completion_rate": (self.complete / judged) if judged else None,
        }


@dataclass(slots=True)
class _Conv:
    cluster_id: str | None = None
    complete: bool | None = None
    counted: bool = False


async def _const(value: str) -> str:
    return value


class GoalClusterer:
    """Component + ``ConversationHooks``: live goal clusters, bounded labels, ``snapshot()``."""

    def __init__(
        self,
        config: ClusteringConfig,
        registry: CollectorRegistry,
        *,
        llm: GoalLLM | None = None,
        embedder: Embedder | None = None,
    ) -> None:
        self._cfg = config
        self.metrics = ClusteringMetrics(registry)
        self._llm = llm if llm is not None else self._default_llm(config)
        self._embedder = embedder if embedder is not None else build_embedder(config.embedding)
        self._batcher = EmbedBatcher(self._embedder, max_batch=config.embedding.batch_size)
        self._reservoir = Reservoir(config.reservoir_size, seed=config.seed)
        # A random per-process prefix: ids recorded in the results topic before a restart (or by
        # another replica) can never be mistaken for a different cluster of this process.
        self._ids = ClusterIdRegistry(prefix=f"{secrets.token_hex(3)}-g")
        self._clusters: dict[str, ClusterInfo] = {}
        self._order: list[str] = []
        self._centroids: Matrix = np.zeros((0, 0), dtype=np.float32)
        self._convs: OrderedDict[str, _Conv] = OrderedDict()
        self._pending: OrderedDict[str, asyncio.Future[str | None]] = OrderedDict()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._run_lock = asyncio.Lock()
        self._baseline = 0.0
        self._ema: float | None = None
        self._since = 0
        self._offered_since_run = 0
        self._runs = 0
        self._last_run: dict[str, Any] = {}
        self._last_error = ""
        self._drift = False

    def _default_llm(self, config: ClusteringConfig) -> GoalLLM:
        if config.mode == "llm":
            return OpenAIGoalLLM(config, self.metrics)
        return ExtractiveGoalLLM(config)

    # ---------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        if not self._cfg.enabled or self._task is not None:
            return
        self._task = asyncio.create_task(self._loop(), name="clustering.scheduler")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            # gather() hands back the task's own CancelledError but still propagates ours.
            await asyncio.gather(task, return_exceptions=True)
        aclose = getattr(self._llm, "aclose", None)
        if aclose is not None:
            await aclose()

    def health(self) -> Health:
        if not self._cfg.enabled:
            return Health("clustering", True, "disabled")
        crashed = self._task is not None and self._task.done()
        detail = f"{len(self._clusters)} clusters, {len(self._reservoir)} in reservoir"
        if self._last_error:
            detail += f", last error: {self._last_error}"
        return Health("clustering", not crashed, detail)

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
            goal = self._label_of(cid)
            return Scored({"goal_id": cid, "goal": goal}, [GoalAssigned(goal)])

        return outcome()

    # ---------------------------------------------------------------- post-score stage

    name = "goals"

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
            return self._label_of(await fut)

        return label()

    def record_outcome(self, conversation_id: str, complete: bool | None) -> None:
        """The completion verdict of a conversation, in either order relative to its assignment."""
        conv = self._conv(conversation_id)
        conv.complete = complete
        item = self._reservoir.get(conversation_id)
        if item is not None:
            item.complete = complete
        self._count(conv)

    # ---------------------------------------------------------------- snapshot

    def snapshot(self) -> dict[str, Any]:
        """What ``GET /clusters`` serves: clusters largest first, with labels, sizes, rates."""
        return {
            "enabled": self._cfg.enabled,
            "mode": self._cfg.mode,
            "reservoir_conversations": len(self._reservoir),
            "runs": self._runs,
            "last_run": dict(self._last_run),
            "clusters": [self._clusters[c].as_json() for c in self._order],
        }

    # ---------------------------------------------------------------- per conversation

    def _conv(self, conversation_id: str) -> _Conv:
        conv = self._convs.get(conversation_id)
        if conv is None:
            conv = self._convs[conversation_id] = _Conv()
            while len(self._convs) > self._cfg.assignment_cache_size:
                self._convs.popitem(last=False)
        else:
            self._convs.move_to_end(conversation_id)
        return conv

    def _count(self, conv: _Conv) -> None:
        if conv.counted or conv.complete is None or conv.cluster_id not in self._clusters:
            return
        info = self._clusters[conv.cluster_id]
        if conv.complete:
            info.complete += 1
        else:
            info.incomplete += 1
        conv.counted = True

    def _label_of(self, cluster_id: str | None) -> str:
        if cluster_id is None or cluster_id not in self._clusters:
            return UNKNOWN
        return self._clusters[cluster_id].goal

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
        offered = self._reservoir.offer(ReservoirItem(ctx.conversation_id, summary, vec))
        self._offered_since_run += 1
        self.metrics.reservoir.set(len(self._reservoir))
        cid = self._nearest(vec)
        conv = self._conv(ctx.conversation_id)
        conv.cluster_id = cid
        if offered and conv.complete is not None:
            item = self._reservoir.get(ctx.conversation_id)
            if item is not None:
                item.complete = conv.complete
        self._count(conv)
        if not self._clusters and len(self._reservoir) >= self._cfg.min_conversations:
            self._wake.set()  # first clustering as soon as there is enough to cluster
        return cid

    def _nearest(self, vec: Matrix) -> str | None:
        if not self._order:
            self.metrics.assignments.labels("unclustered").inc()
            return None
        idx, dist = assign_nearest(vec[None, :], self._centroids)
        cid = self._order[int(idx[0])]
        self._clusters[cid].assigned_since += 1
        self.metrics.assignments.labels("assigned").inc()
        d = float(dist[0])
        a = self._cfg.drift_ema_alpha
        self._ema = d if self._ema is None else (1 - a) * self._ema + a * d
        self._since += 1
        self.metrics.assignment_distance.set(self._ema)
        if (
            self._since >= self._cfg.drift_min_assignments
            and self._baseline > 0
            and self._ema > self._cfg.drift_ratio * self._baseline
        ):
            self._drift = True
            self._wake.set()
        return cid

    # ---------------------------------------------------------------- re-clustering

    async def _loop(self) -> None:
        while True:
            try:
                await asyncio.wait_for(self._wake.wait(), self._cfg.recluster_interval_seconds)
                trigger = "drift" if self._drift else "initial"
            except TimeoutError:
                trigger = "schedule"
            self._wake.clear()
            self._drift = False
            if trigger == "schedule" and self._offered_since_run == 0:
                self.metrics.runs.labels(trigger, "skipped").inc()
                continue
            await self.recluster(trigger)

    async def recluster(self, trigger: str = "manual") -> bool:
        """Run Algorithm 1 on the reservoir and swap the live clusters; False if skipped/failed."""
        async with self._run_lock:
            items = self._reservoir.items()
            if len(items) < self._cfg.min_conversations:
                self.metrics.runs.labels(trigger, "skipped").inc()
                return False
            started = time.perf_counter()
            try:
                await self._recluster(items)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the old clusters stay live; the next trigger retries
                self._last_error = type(exc).__name__
                self.metrics.runs.labels(trigger, "error").inc()
                log.warning("clustering.run_failed", trigger=trigger, error=type(exc).__name__)
                return False
            elapsed = time.perf_counter() - started
            self._runs += 1
            self._last_error = ""
            self._last_run = {
                "trigger": trigger,
                "seconds": round(elapsed, 3),
                "at": time.time(),
                "conversations": len(items),
                "clusters": len(self._order),
            }
            self.metrics.runs.labels(trigger, "ok").inc()
            self.metrics.run_duration.observe(elapsed)
            log.info(
                "clustering.run_done",
                trigger=trigger,
                clusters=len(self._order),
                conversations=len(items),
                seconds=round(elapsed, 3),
            )
            return True

    async def _recluster(self, items: list[ReservoirItem]) -> None:
        vectors = np.stack([it.vector for it in items]).astype(np.float32)
        cfg = self._cfg
        res = await llm_guided_clustering(
            [it.summary for it in items],
            vectors,
            llm=self._llm,
            embedder=self._embedder,
            k1=cfg.k1,
            examples=cfg.examples_per_group,
            seed=cfg.seed,
            stop_rule=cfg.stop_rule,
            max_merge_queries=cfg.max_merge_queries,
            kmeans_n_init=cfg.kmeans_n_init,
        )
        old = {cid: self._centroids[i] for i, cid in enumerate(self._order)}
        ids = self._ids.match(old, res.centroids, cfg.id_match_min_similarity)
        clusters: dict[str, ClusterInfo] = {}
        for c, cid in enumerate(ids):  # ids are in decreasing size order
            named = res.sizes[c] >= cfg.min_conversations_per_name
            clusters[cid] = ClusterInfo(
                cid,
                res.labels[c] if named else None,
                cid if c < cfg.top_n_labels else OTHER,
                metric_label(res.labels[c], cfg.max_label_chars) if named else UNNAMED,
                res.sizes[c],
            )
        for it, a in zip(items, res.assignments.tolist(), strict=True):
            if it.complete is not None:
                info = clusters[ids[a]]
                info.complete += int(it.complete)
                info.incomplete += int(not it.complete)
        _, dist = assign_nearest(vectors, res.centroids)
        # Swap in one step: hooks running concurrently see either the old or the new table.
        self._clusters, self._order, self._centroids = clusters, ids, res.centroids
        self._baseline = float(dist.mean())
        self._ema, self._since, self._offered_since_run = None, 0, 0
        self._wake.clear()  # whatever asked for a run is answered by this one
        self._drift = False
        for conv in self._convs.values():
            conv.counted = conv.counted or conv.complete is not None
        self._reservoir.decay()
        self.metrics.clusters.set(len(ids))
        self.metrics.cluster_size.clear()
        self.metrics.goal_info.clear()
        for info in clusters.values():
            self.metrics.cluster_size.labels(info.goal).inc(info.size)
            if info.goal != OTHER:
                self.metrics.goal_info.labels(info.goal, info.name).set(1)
