"""When to re-cluster, and the re-clustering run itself.

The live conversations' summaries go into a bounded :class:`~sidecar.clustering.reservoir.Reservoir`
(:meth:`ReclusterScheduler.offer`). Algorithm 1 re-runs on it (:meth:`ReclusterScheduler.recluster`):

* first as soon as ``min_conversations`` summaries are held (trigger ``initial``);
* then every ``recluster_interval_seconds`` when something new arrived (``schedule``; a period with
  nothing new is counted as skipped);
* early on drift (``drift``): the running mean (EMA) distance of new assignments to their centroid
  (:meth:`ReclusterScheduler.observe_distance`) above ``drift_ratio`` x the mean distance of the
  sample at the last run, after at least ``drift_min_assignments`` assignments.

A successful run replaces the :class:`~sidecar.clustering.model.GoalModel`'s clusters and restarts
the :class:`~sidecar.clustering.completion_rate.CompletionRates` from the sample; a failed one keeps
the old clusters (the next trigger retries). k-means and embeddings run in worker threads and LLM
calls are awaited, so the event loop never blocks. Runs never overlap. The background loop is the
named task ``clustering.scheduler`` (:func:`sidecar.supervision.spawn`); it only ends by dying.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
import structlog

from sidecar.clustering.algorithm import ClusteringResult, assign_nearest, llm_guided_clustering
from sidecar.clustering.completion_rate import CompletionRates
from sidecar.clustering.config import ClusteringConfig
from sidecar.clustering.embed import Embedder
from sidecar.clustering.llm import GoalLLM
from sidecar.clustering.metrics import ClusteringMetrics
from sidecar.clustering.model import GoalModel
from sidecar.clustering.records import Published
from sidecar.clustering.reservoir import Reservoir, ReservoirItem
from sidecar.supervision import Supervised, spawn

log = structlog.get_logger()

TASK_NAME = "clustering.scheduler"


class ReclusterScheduler:
    """The reservoir sample, the triggers and the runs of Algorithm 1 on it."""

    def __init__(
        self,
        config: ClusteringConfig,
        metrics: ClusteringMetrics,
        *,
        model: GoalModel,
        completion: CompletionRates,
        reservoir: Reservoir,
        llm: GoalLLM,
        embedder: Embedder,
        publish: Callable[[ClusteringResult], Awaitable[Published]] | None = None,
        may_run: Callable[[], bool] | None = None,
    ) -> None:
        """``publish``: instead of applying a run's result here, hand it on (the fleet's leader
        writes it to the model topic, and every replica applies what it reads back): ``not_leader``
        ends the run as a step-down (counted ``not_leader``, logged at info), ``publish_error``
        fails it. ``may_run``: runs only happen while it says so (the fleet's leader)."""
        self._cfg = config
        self._publish = publish
        self._may_run = may_run
        self._metrics = metrics
        self._model = model
        self._completion = completion
        self._reservoir = reservoir
        self._llm = llm
        self._embedder = embedder
        self._wake = asyncio.Event()
        self._task: Supervised | None = None
        self._run_lock = asyncio.Lock()
        self._baseline = 0.0
        self._ema: float | None = None
        self._since = 0
        self._offered_since_run = 0
        self._drift = False
        self.runs = 0
        self.last_run: dict[str, Any] = {}
        self.last_error = ""

    # ---------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        """Start the background loop (once; again after :meth:`stop`)."""
        if self._task is None:
            self._task = spawn(TASK_NAME, self._loop)

    async def stop(self) -> None:
        """Stop the loop (a run in progress is cancelled: the old clusters stay). Idempotent."""
        task, self._task = self._task, None
        if task is not None:
            await task.stop()

    @property
    def running(self) -> bool:
        """Whether the loop was started and has not been stopped (it may have died)."""
        return self._task is not None

    @property
    def crashed(self) -> bool:
        """Whether the loop ended on its own (it only ends by dying)."""
        return self._task is not None and self._task.done()

    # ---------------------------------------------------------------- triggers

    def offer(self, item: ReservoirItem) -> None:
        """Keep a new summary for the next run (if the reservoir sample takes it)."""
        self._reservoir.offer(item)
        self._offered_since_run += 1
        self._metrics.reservoir.set(len(self._reservoir))
        if not len(self._model) and len(self._reservoir) >= self._cfg.min_conversations:
            self._wake.set()  # first clustering as soon as there is enough to cluster

    def observe_distance(self, distance: float) -> None:
        """A new conversation was assigned at ``distance`` from its centroid: the drift check."""
        a = self._cfg.drift_ema_alpha
        self._ema = distance if self._ema is None else (1 - a) * self._ema + a * distance
        self._since += 1
        self._metrics.assignment_distance.set(self._ema)
        if (
            self._since >= self._cfg.drift_min_assignments
            and self._baseline > 0
            and self._ema > self._cfg.drift_ratio * self._baseline
        ):
            self._drift = True
            self._wake.set()

    async def _loop(self) -> None:
        while True:
            try:
                async with asyncio.timeout(self._cfg.recluster_interval_seconds):
                    await self._wake.wait()
                trigger = "drift" if self._drift else "initial"
            except TimeoutError:
                trigger = "schedule"
            self._wake.clear()
            self._drift = False
            if trigger == "schedule" and self._offered_since_run == 0:
                self._metrics.runs.labels(trigger, "skipped").inc()
                continue
            await self.recluster(trigger)

    # ---------------------------------------------------------------- runs

    async def recluster(self, trigger: str = "manual") -> bool:
        """Run Algorithm 1 on the reservoir and swap the live clusters; False if skipped/failed."""
        async with self._run_lock:
            if self._may_run is not None and not self._may_run():
                self._metrics.runs.labels(trigger, "not_leader").inc()
                return False
            # In conversation-id order: a run depends on which conversations it clusters, not on the
            # order they arrived in (a fleet's leader reads them from several replicas' writes).
            items = sorted(self._reservoir.items(), key=lambda it: it.conversation_id)
            items = _one_dimension(items)
            if len(items) < self._cfg.min_conversations:
                self._metrics.runs.labels(trigger, "skipped").inc()
                return False
            started = time.perf_counter()
            try:
                await self._recluster(items)
            except asyncio.CancelledError:
                raise
            except SteppedDown:  # leadership moved on during the run: correct fencing, not a failure
                self._metrics.runs.labels(trigger, "not_leader").inc()
                log.info("clustering.stepped_down", trigger=trigger)
                return False
            except Exception as exc:  # the old clusters stay live; the next trigger retries
                self.last_error = type(exc).__name__
                self._metrics.runs.labels(trigger, "error").inc()
                log.warning("clustering.run_failed", trigger=trigger, error=type(exc).__name__)
                return False
            elapsed = time.perf_counter() - started
            self.runs += 1
            self.last_error = ""
            self.last_run = {
                "trigger": trigger,
                "seconds": round(elapsed, 3),
                "at": time.time(),
                "conversations": len(items),
                "clusters": len(self._model),
            }
            self._metrics.runs.labels(trigger, "ok").inc()
            self._metrics.run_duration.observe(elapsed)
            log.info(
                "clustering.run_done",
                trigger=trigger,
                clusters=len(self._model),
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
        rows = list(zip(res.assignments.tolist(), (it.complete for it in items), strict=True))
        _, dist = assign_nearest(vectors, res.centroids)
        if self._publish is not None:
            published = await self._publish(res)
            if published == "not_leader":
                raise SteppedDown("this replica does not lead the fleet any more")
            if published != "published":
                raise ModelNotPublished(f"the goal model was not published ({published})")
        else:
            # No await from here on: hooks running concurrently see the old clusters and counts or
            # the new ones, never a mix.
            ids = self._model.apply(res)
            self._completion.restart(ids, ((ids[row], complete) for row, complete in rows))
            self._model.publish(self._metrics)
        self._baseline = float(dist.mean())
        self._ema, self._since, self._offered_since_run = None, 0, 0
        self._wake.clear()  # whatever asked for a run is answered by this one
        self._drift = False
        self._reservoir.decay()


def _one_dimension(items: list[ReservoirItem]) -> list[ReservoirItem]:
    """The items of the most common embedding dimension (a fleet's inputs come from other
    processes: one of another dimension must not make every run fail)."""
    if not items:
        return items
    dims = Counter(it.vector.shape[0] for it in items)
    if len(dims) == 1:
        return items
    keep = dims.most_common(1)[0][0]
    log.warning("clustering.mixed_dimensions", kept=keep, dropped=sum(n for d, n in dims.items() if d != keep))
    return [it for it in items if it.vector.shape[0] == keep]


class ModelNotPublished(RuntimeError):
    """A fleet leader's run whose model Kafka did not acknowledge: counted as a failed run; the next
    trigger retries."""


class SteppedDown(RuntimeError):
    """A run that ended because its replica no longer leads the fleet (a newer term took over): the
    new leader's model stands, so the run is counted ``not_leader``, not as an error."""
