"""Stable ids (Hungarian matching, no reuse) and the bounded reservoir."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.clustering.embed import normalize_rows
from sidecar.clustering.ids import ClusterIdRegistry
from sidecar.clustering.reservoir import Reservoir, ReservoirItem


def unit(rows: list[list[float]]) -> np.ndarray:
    return normalize_rows(np.array(rows, dtype=np.float32))


def test_permuted_clusters_keep_their_ids() -> None:
    reg = ClusterIdRegistry()
    first = unit([[1, 0, 0], [0, 1, 0], [0, 0, 1]])
    ids = reg.match({}, first, 0.5)
    assert ids == ["g1", "g2", "g3"]
    old = dict(zip(ids, first, strict=True))
    moved = unit([[0, 0.1, 1], [1, 0.05, 0], [0.1, 1, 0]])
    assert reg.match(old, moved, 0.5) == ["g3", "g1", "g2"]


def test_unmatched_get_fresh_ids_and_retired_ids_are_never_reused() -> None:
    reg = ClusterIdRegistry()
    a = unit([[1, 0, 0], [0, 1, 0]])
    ids = reg.match({}, a, 0.5)
    # g2's goal disappears, a new one appears far from everything: it must not inherit g2.
    b = unit([[1, 0, 0], [0, 0, 1]])
    ids_b = reg.match(dict(zip(ids, a, strict=True)), b, 0.5)
    assert ids_b == ["g1", "g3"]
    # The old goal comes back later: it is a new cluster now, with a new id.
    c = unit([[1, 0, 0], [0, 0, 1], [0, 1, 0]])
    ids_c = reg.match(dict(zip(ids_b, b, strict=True)), c, 0.5)
    assert ids_c == ["g1", "g3", "g4"]


def test_split_cluster_keeps_its_id_on_the_closer_half() -> None:
    reg = ClusterIdRegistry()
    ids = reg.match({}, unit([[1, 0]]), 0.5)
    halves = unit([[1, 0.3], [1, -0.1]])
    assert reg.match(dict(zip(ids, unit([[1, 0]]), strict=True)), halves, 0.5) == ["g2", "g1"]


def test_registry_rejects_bad_start() -> None:
    with pytest.raises(ValueError, match="next_number"):
        ClusterIdRegistry(0)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(1, 6), min_size=1, max_size=8), st.integers(0, 1000))
def test_ids_are_unique_and_monotonic(ks: list[int], seed: int) -> None:
    reg = ClusterIdRegistry()
    rng = np.random.default_rng(seed)
    old: dict[str, np.ndarray] = {}
    issued: set[str] = set()
    for k in ks:
        cents = normalize_rows(rng.normal(size=(k, 4)))
        ids = reg.match(old, cents, 0.3)
        assert len(set(ids)) == k
        fresh = set(ids) - set(old)
        assert not fresh & issued  # a new id was never handed out before
        issued |= set(ids)
        old = dict(zip(ids, cents, strict=True))


def item(i: int) -> ReservoirItem:
    return ReservoirItem(f"c{i}", f"s{i}", np.zeros(2, dtype=np.float32))


def test_reservoir_is_bounded_and_unique_per_conversation() -> None:
    r = Reservoir(10, seed=1)
    for i in range(1000):
        r.offer(item(i))
        r.offer(item(i))  # a replay never duplicates
    assert len(r) == 10
    ids = [it.conversation_id for it in r.items()]
    assert len(set(ids)) == 10
    assert all(r.get(c) is not None for c in ids)
    assert r.get("c-none") is None
    with pytest.raises(ValueError, match="capacity"):
        Reservoir(0)


def test_reservoir_is_uniform_then_decay_favours_recent_items() -> None:
    counts = np.zeros(2)
    for seed in range(200):
        r = Reservoir(20, seed=seed)
        for i in range(200):
            r.offer(item(i))
        r.decay()
        for i in range(200, 400):
            r.offer(item(i))
        late = sum(int(it.conversation_id[1:]) >= 200 for it in r.items())
        counts += [20 - late, late]
    share_recent = counts[1] / counts.sum()
    # Without decay the second half would hold 50%; with the seen-count halved it holds ~2/3.
    assert 0.6 < share_recent < 0.73, share_recent
