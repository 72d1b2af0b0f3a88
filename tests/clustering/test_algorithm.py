"""Algorithm 1's merge loop, with deterministic decision functions."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.clustering.algorithm import (
    ClusteringResult,
    assign_nearest,
    centroids_of,
    kmeans,
    llm_guided_clustering,
)
from sidecar.clustering.embed import Matrix, normalize_rows
from sidecar.tools.clustering.evaluation import adjusted_rand_index
from tests.clustering.fakes import HashEmbedder, OracleLLM, blobs


async def run(texts: list[str], vectors: Matrix, llm: OracleLLM, **kw: Any) -> ClusteringResult:
    kw.setdefault("k1", 12)
    return await llm_guided_clustering(texts, vectors, llm=llm, embedder=HashEmbedder(), **kw)


async def test_oracle_merges_recover_the_true_groups() -> None:
    texts, vecs, truth = blobs(groups=4, per_group=40)
    llm = OracleLLM()
    res = await run(texts, vecs, llm, k1=12, seed=3)
    assert res.k == 4
    assert adjusted_rand_index(truth, res.assignments) == pytest.approx(1.0)
    assert sorted(res.labels) == ["goal g0", "goal g1", "goal g2", "goal g3"]
    assert sum(res.sizes) == 160
    assert res.sizes == sorted(res.sizes, reverse=True)
    assert res.stats["merges"] == 8
    assert res.stats["describe_calls"] == 12 + 8  # one per initial cluster + one per merge
    assert res.stats["stopped_by"] == "all_pairs_failed"


async def test_never_merge_asks_every_pair_once() -> None:
    texts, vecs, _ = blobs(groups=3, per_group=30)
    llm = OracleLLM(decide=lambda q: False)
    res = await run(texts, vecs, llm, k1=7)
    assert res.k == 7
    assert res.stats["merge_queries"] == 7 * 6 // 2
    assert res.stats["stopped_by"] == "all_pairs_failed"


async def test_pairs_are_asked_in_decreasing_description_similarity_when_nothing_merges() -> None:
    texts, vecs, _ = blobs(groups=5, per_group=20)
    llm = OracleLLM(decide=lambda q: False)
    await run(texts, vecs, llm, k1=8)
    sims = [q.description_similarity for q in llm.queries]
    assert sims == sorted(sims, reverse=True)


async def test_consecutive_failures_rule_stops_after_L_failures() -> None:
    texts, vecs, _ = blobs(groups=3, per_group=30)
    llm = OracleLLM(decide=lambda q: False)
    res = await run(texts, vecs, llm, k1=6, stop_rule="consecutive_failures")
    assert res.stats["merge_queries"] == 6
    assert res.stats["stopped_by"] == "consecutive_failures"


async def test_budget_bounds_merge_queries() -> None:
    texts, vecs, _ = blobs(groups=3, per_group=30)
    res = await run(texts, vecs, OracleLLM(decide=lambda q: False), k1=6, max_merge_queries=4)
    assert res.stats["merge_queries"] == 4
    assert res.stats["stopped_by"] == "budget"


async def test_always_merge_ends_with_one_cluster() -> None:
    texts, vecs, _ = blobs(groups=3, per_group=10)
    llm = OracleLLM(decide=lambda q: True)
    res = await run(texts, vecs, llm, k1=5)
    assert res.k == 1
    assert res.stats["merges"] == 4
    assert res.stats["stopped_by"] == "one_cluster"
    assert (res.assignments == 0).all()
    # Every re-description after a merge is handed the label it replaces.
    assert len(llm.describes) == 5 + 4
    assert all(d[2] is None for d in llm.describes[:5])
    assert all(d[2] is not None and d[2].startswith("goal g") for d in llm.describes[5:])


async def test_examples_are_bounded_and_disjoint() -> None:
    texts, vecs, _ = blobs(groups=4, per_group=50)
    llm = OracleLLM(decide=lambda q: False)
    await run(texts, vecs, llm, k1=6, examples=7)
    for q in llm.queries:
        assert 0 < len(q.group1) <= 7 and 0 < len(q.group2) <= 7 and len(q.others) <= 7
        assert not set(q.group1) & set(q.group2)
        assert not (set(q.group1) | set(q.group2)) & set(q.others)
    for group, not_in, _ in llm.describes:
        assert len(group) <= 10 and len(not_in) <= 10
        assert not set(group) & set(not_in)


async def test_same_seed_same_result_and_same_questions() -> None:
    texts, vecs, _ = blobs(groups=4, per_group=30, spread=0.6)
    flips = itertools.cycle([True, False, False])
    a_llm = OracleLLM(decide=lambda q: next(flips))
    a = await run(texts, vecs, a_llm, k1=9, seed=11)
    flips = itertools.cycle([True, False, False])
    b_llm = OracleLLM(decide=lambda q: next(flips))
    b = await run(texts, vecs, b_llm, k1=9, seed=11)
    assert a.k == b.k and a.labels == b.labels
    assert np.array_equal(a.assignments, b.assignments)
    assert [(q.group1, q.group2, q.others) for q in a_llm.queries] == [
        (q.group1, q.group2, q.others) for q in b_llm.queries
    ]


async def test_k1_larger_than_data_is_capped() -> None:
    texts = ["g0 a", "g0 b", "g1 c"]
    vecs = normalize_rows(np.array([[1, 0], [1, 0.01], [0, 1]], dtype=np.float32))
    res = await run(texts, vecs, OracleLLM(), k1=50)
    assert res.stats["k1"] <= 3
    assert res.k == 2


async def test_identical_vectors_give_one_cluster() -> None:
    vecs = normalize_rows(np.ones((10, 4), dtype=np.float32))
    res = await run([f"g0 {i}" for i in range(10)], vecs, OracleLLM(), k1=5)
    assert res.k == 1 and res.sizes == [10]


async def test_bad_inputs_are_rejected() -> None:
    with pytest.raises(ValueError, match="nothing"):
        await run([], np.zeros((0, 4), dtype=np.float32), OracleLLM())
    with pytest.raises(ValueError, match="one vector"):
        await run(["a", "b"], np.zeros((3, 4), dtype=np.float32), OracleLLM())


@settings(max_examples=30, deadline=None)
@given(
    n=st.integers(1, 40),
    k1=st.integers(2, 8),
    seed=st.integers(0, 2**16),
    answers=st.lists(st.booleans(), min_size=1, max_size=20),
)
async def test_invariants_for_any_decisions(n: int, k1: int, seed: int, answers: list[bool]) -> None:
    rng = np.random.default_rng(seed)
    vecs = normalize_rows(rng.normal(size=(n, 6)))
    texts = [f"g{i % 3} t{i}" for i in range(n)]
    it = itertools.cycle(answers)
    res = await run(texts, vecs, OracleLLM(decide=lambda q: next(it)), k1=k1, seed=seed)
    assert 1 <= res.k <= min(k1, n)
    assert len(res.labels) == res.k == len(res.sizes) == res.centroids.shape[0]
    assert set(res.assignments.tolist()) == set(range(res.k))
    assert sum(res.sizes) == n
    assert res.sizes == sorted(res.sizes, reverse=True)
    assert np.bincount(res.assignments, minlength=res.k).tolist() == res.sizes


def test_kmeans_is_deterministic_for_a_seed() -> None:
    _, vecs, _ = blobs(groups=5, per_group=20, spread=0.8)
    assert np.array_equal(kmeans(vecs, 7, 5, 2), kmeans(vecs, 7, 5, 2))


def test_assign_nearest_and_centroids() -> None:
    vecs = normalize_rows(np.array([[1, 0], [0.9, 0.1], [0, 1]], dtype=np.float32))
    cents = centroids_of(vecs, np.array([0, 0, 1]), 2)
    idx, dist = assign_nearest(normalize_rows(np.array([[1, 0.05], [0.1, 1]])), cents)
    assert idx.tolist() == [0, 1]
    assert (dist >= 0).all() and (dist < 0.2).all()


async def test_gather_or_cancel_raises_the_first_failure_and_leaves_nothing_running() -> None:
    import asyncio

    from sidecar.clustering.algorithm import gather_or_cancel
    from sidecar.errors import RetryableError

    cancelled: list[int] = []

    async def slow(i: int) -> int:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            cancelled.append(i)
            raise
        return i

    async def fail() -> int:
        await asyncio.sleep(0)
        raise RetryableError("down")

    with pytest.raises(RetryableError):
        await gather_or_cancel([slow(1), fail(), slow(2)])
    assert sorted(cancelled) == [1, 2]
    assert await gather_or_cancel(asyncio.sleep(0, result=i) for i in range(3)) == [0, 1, 2]
