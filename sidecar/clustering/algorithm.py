"""Algorithm 1 (paper Section 4.1): LLM-guided clustering of goal summaries.

1. k-means with ``k1`` (an overestimate) on the summary embeddings;
2. describe every cluster from ``m`` sampled members and ``m`` sampled non-members;
3. embed the descriptions, D = their cosine matrix;
4. repeatedly take the most similar live pair (i, j) that has not failed and ask whether to merge,
   showing ``m`` members of each and ``m`` of the rest. Merge: j's members join i, i is
   re-described and its row of D recomputed (it is a new cluster, so its old failures are
   forgotten), j is deleted. No merge: the pair is marked failed.
   Stop when every remaining pair has failed (``all_pairs``, the issue's rule) or - the
   pseudocode's literal rule - after |L| failures in a row (``consecutive_failures``); a budget of
   merge queries bounds the cost either way.
5. A :class:`~sidecar.clustering.llm.ClusterNamer` (the LLM-free mode) then names every final
   cluster against all the others; an instruct model's descriptions are kept as they are.

Deterministic given ``seed``: k-means, every sample of examples and the pair order (ties in D
break towards the lowest (i, j)). The CPU-heavy steps (k-means, embedding) go through
``offload`` (``asyncio.to_thread`` by default) so the event loop never blocks on them.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt
import structlog

from sidecar.clustering.config import StopRule
from sidecar.clustering.embed import Embedder, Matrix, normalize_rows
from sidecar.clustering.llm import ClusterNamer, GoalLLM, MergeQuery

log = structlog.get_logger()

T = TypeVar("T")
Offload = Callable[..., Awaitable[Any]]
IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class ClusteringResult:
    """Output of Algorithm 1: ``k`` clusters numbered 0..k-1 by decreasing size."""

    k: int
    labels: list[str]
    assignments: IntArray
    centroids: Matrix
    sizes: list[int]
    stats: dict[str, Any] = field(default_factory=dict)


def kmeans(vectors: Matrix, k: int, seed: int, n_init: int) -> IntArray:
    """Plain k-means on unit vectors (deterministic for a seed); k is capped at the distinct rows."""
    from sklearn.cluster import KMeans

    distinct = len(np.unique(vectors.round(6), axis=0))
    k = max(1, min(k, distinct))
    if k == 1:
        return np.zeros(len(vectors), dtype=np.int64)
    km = KMeans(n_clusters=k, n_init=n_init, random_state=seed)
    labels: IntArray = km.fit_predict(vectors).astype(np.int64)
    return labels


def centroids_of(vectors: Matrix, assignments: IntArray, k: int) -> Matrix:
    """Unit-length mean vector of each cluster 0..k-1."""
    sums = np.zeros((k, vectors.shape[1]), dtype=np.float64)
    for c in range(k):  # k masked sums: ~50x faster than np.add.at on 10k x 384
        sums[c] = vectors[assignments == c].sum(axis=0)
    return normalize_rows(sums)


def _sample(rng: np.random.Generator, idx: npt.NDArray[np.int64], m: int) -> list[int]:
    if len(idx) <= m:
        return [int(i) for i in idx]
    return [int(i) for i in rng.choice(idx, size=m, replace=False)]


async def gather_or_cancel(coros: Iterable[Coroutine[Any, Any, T]]) -> list[T]:
    """Like ``gather``, but the first failure cancels the others, waits for them, and is raised.

    Nothing is left running behind a failed batch (no request still in flight when its client
    is closed).
    """
    try:
        async with asyncio.TaskGroup() as tg:
            tasks = [tg.create_task(c) for c in coros]
    except BaseExceptionGroup as group:
        raise group.exceptions[0] from None
    return [t.result() for t in tasks]


async def _to_thread(fn: Callable[..., T], *args: Any) -> T:
    return await asyncio.to_thread(fn, *args)


class _Run:
    """The mutable state of one run: assignments, labels, description matrix, failed pairs."""

    def __init__(
        self, texts: list[str], vectors: Matrix, assign: IntArray, llm: GoalLLM, rng: np.random.Generator
    ) -> None:
        self.texts = texts
        self.vectors = vectors
        self.assign = assign
        self.llm = llm
        self.rng = rng
        self.k = int(assign.max()) + 1
        self.members = {c: np.flatnonzero(assign == c) for c in range(self.k)}
        self.labels: dict[int, str] = {}
        self.cents = centroids_of(vectors, assign, self.k)
        self.d = np.zeros((self.k, self.k), dtype=np.float64)
        self.failed = np.eye(self.k, dtype=bool)
        self.alive = np.ones(self.k, dtype=bool)
        self.upper = np.triu(np.ones((self.k, self.k), dtype=bool), 1)
        self.describe_calls = 0

    def _pick(self, idx: npt.NDArray[np.int64], m: int) -> list[str]:
        return [self.texts[i] for i in _sample(self.rng, idx, m)]

    def describe_args(self, c: int) -> tuple[list[str], list[str]]:
        m = self.llm.describe_examples
        return self._pick(self.members[c], m), self._pick(np.flatnonzero(self.assign != c), m)

    def set_descriptions(self, desc_vecs: Matrix) -> None:
        self.desc_vecs = desc_vecs
        self.d = (desc_vecs @ desc_vecs.T).astype(np.float64)

    def next_pair(self) -> tuple[int, int] | None:
        """The most similar live pair that has not failed (lowest (i, j) on ties)."""
        ok = self.upper & ~self.failed & self.alive[:, None] & self.alive[None, :]
        masked = np.where(ok, self.d, -np.inf)
        i, j = divmod(int(np.argmax(masked)), self.k)
        return (i, j) if ok[i, j] else None

    def query(self, i: int, j: int, m: int) -> MergeQuery:
        rest = np.flatnonzero((self.assign != i) & (self.assign != j))
        return MergeQuery(
            group1=self._pick(self.members[i], m),
            group2=self._pick(self.members[j], m),
            others=self._pick(rest, m),
            label1=self.labels[i],
            label2=self.labels[j],
            centroid_similarity=float(self.cents[i] @ self.cents[j]),
            description_similarity=float(self.d[i, j]),
        )

    def merge(self, i: int, j: int) -> None:
        """j's members join i; j is deleted; i's failures are forgotten (it is a new cluster)."""
        self.assign[self.assign == j] = i
        self.members[i] = np.flatnonzero(self.assign == i)
        self.members[j] = np.zeros(0, dtype=np.int64)
        self.alive[j] = False
        del self.labels[j]
        self.failed[i, :] = False
        self.failed[:, i] = False
        self.failed[i, i] = True
        one = np.zeros(len(self.members[i]), dtype=np.int64)
        self.cents[i] = centroids_of(self.vectors[self.members[i]], one, 1)[0]

    def relabel(self, i: int, label: str, vec: Matrix) -> None:
        self.labels[i] = label
        self.desc_vecs[i] = vec[0]
        self.d[i, :] = self.desc_vecs @ self.desc_vecs[i]
        self.d[:, i] = self.d[i, :]

    def finish(self, stats: dict[str, Any]) -> ClusteringResult:
        """Survivors renumbered 0..k-1 by decreasing size (ties: lower original index first)."""
        survivors = sorted(np.flatnonzero(self.alive).tolist(), key=lambda c: (-len(self.members[c]), c))
        remap = np.full(self.k, -1, dtype=np.int64)
        for new, old in enumerate(survivors):
            remap[old] = new
        final: IntArray = remap[self.assign]
        k = len(survivors)
        return ClusteringResult(
            k=k,
            labels=[self.labels[c] for c in survivors],
            assignments=final,
            centroids=centroids_of(self.vectors, final, k),
            sizes=[len(self.members[c]) for c in survivors],
            stats=stats,
        )


async def llm_guided_clustering(
    summaries: Sequence[str],
    vectors: Matrix,
    *,
    llm: GoalLLM,
    embedder: Embedder,
    k1: int,
    examples: int = 10,
    seed: int = 0,
    stop_rule: StopRule = "all_pairs",
    max_merge_queries: int = 2000,
    kmeans_n_init: int = 4,
    offload: Offload = _to_thread,
) -> ClusteringResult:
    """Run Algorithm 1 on ``summaries`` whose unit embeddings are ``vectors``."""
    n = len(summaries)
    if n == 0:
        raise ValueError("nothing to cluster")
    if vectors.shape[0] != n:
        raise ValueError("one vector per summary is required")

    # Phase 1: k-means, then one description per cluster.
    t0 = time.perf_counter()
    assign: IntArray = await offload(kmeans, vectors, k1, seed, kmeans_n_init)
    t1 = time.perf_counter()
    run = _Run(list(summaries), vectors, assign, llm, np.random.default_rng(seed))
    # Samples are drawn in cluster order before any await, so concurrency cannot change them.
    jobs = [run.describe_args(c) for c in range(run.k)]
    described = await gather_or_cancel(llm.describe(pos, neg) for pos, neg in jobs)
    run.labels = dict(enumerate(described))
    run.describe_calls = run.k
    run.set_descriptions(await offload(embedder.embed, described))
    t2 = time.perf_counter()

    # Phase 2: merge loop.
    queries = merges = consecutive = 0
    stopped_by = "all_pairs_failed"
    while True:
        live = int(run.alive.sum())
        if live < 2:
            stopped_by = "one_cluster"
            break
        if stop_rule == "consecutive_failures" and consecutive >= live:
            stopped_by = "consecutive_failures"
            break
        if queries >= max_merge_queries:
            stopped_by = "budget"
            break
        pair = run.next_pair()
        if pair is None:
            break
        i, j = pair
        queries += 1
        if await llm.should_merge(run.query(i, j, examples)):
            merges += 1
            consecutive = 0
            previous = run.labels[i]
            run.merge(i, j)
            pos, neg = run.describe_args(i)
            label = await llm.describe(pos, neg, previous)
            run.describe_calls += 1
            run.relabel(i, label, await offload(embedder.embed, [label]))
        else:
            run.failed[i, j] = run.failed[j, i] = True
            consecutive += 1

    stats = {
        "n": n,
        "k1": run.k,
        "describe_calls": run.describe_calls,
        "merge_queries": queries,
        "merges": merges,
        "stopped_by": stopped_by,
        "seconds": {
            "kmeans": round(t1 - t0, 3),
            "describe": round(t2 - t1, 3),
            "merge_loop": round(time.perf_counter() - t2, 3),
        },
    }
    result = await _final_names(run.finish(stats), summaries, llm, seed, offload)
    log.info("clustering.algorithm_done", n=n, k1=run.k, k=result.k, merge_queries=queries, merges=merges)
    return result


async def _final_names(
    result: ClusteringResult, summaries: Sequence[str], namer: GoalLLM, seed: int, offload: Offload
) -> ClusteringResult:
    """``result`` with every cluster named against all the others, from a seeded sample of members
    (unchanged unless ``namer`` is a :class:`ClusterNamer`).

    The loop's labels only compared a cluster with "the rest" and were written before later
    merges; names for people come from the final partition.
    """
    if not isinstance(namer, ClusterNamer):
        return result
    rng = np.random.default_rng(seed)
    m = namer.describe_examples
    groups = [[summaries[i] for i in _sample(rng, np.flatnonzero(result.assignments == c), m)] for c in range(result.k)]
    return dataclasses.replace(result, labels=await offload(namer.name_clusters, groups))


def assign_nearest(vectors: Matrix, centroids: Matrix) -> tuple[IntArray, npt.NDArray[np.float64]]:
    """Nearest centroid (cosine on unit vectors) and the Euclidean distance to it, per row."""
    sims = vectors @ centroids.T
    idx: IntArray = np.argmax(sims, axis=1).astype(np.int64)
    best = sims[np.arange(len(vectors)), idx].astype(np.float64)
    dist = np.sqrt(np.maximum(0.0, 2.0 - 2.0 * best))
    return idx, dist
