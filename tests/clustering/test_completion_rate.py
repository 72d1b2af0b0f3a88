"""Completion counts per cluster: either order of verdict and assignment, once each, bounded."""

from __future__ import annotations

import numpy as np

from sidecar.clustering.completion_rate import CompletionRates
from sidecar.clustering.reservoir import Reservoir, ReservoirItem


def item(cid: str) -> ReservoirItem:
    return ReservoirItem(cid, f"summary of {cid}", np.ones(4, dtype=np.float32) / 2)


def rates(capacity: int = 100) -> tuple[CompletionRates, Reservoir]:
    reservoir = Reservoir(50)
    r = CompletionRates(capacity, reservoir)
    r.restart(["g1", "g2"], [])
    return r, reservoir


def test_a_verdict_counts_once_whichever_comes_first() -> None:
    r, _ = rates()
    r.record_outcome("before", True)  # verdict first
    r.assigned("before", "g1")
    r.assigned("after", "g1")
    r.record_outcome("after", False)  # verdict after
    r.record_outcome("after", False)  # repeated: counted once
    r.record_outcome("after", True)  # a changed verdict is not counted again either
    r.assigned("before", "g1")  # a replayed assignment
    assert r.counts("g1") == (1, 1) and r.counts("g2") == (0, 0)


def test_unknown_verdicts_unassigned_and_unknown_clusters_count_nothing() -> None:
    r, _ = rates()
    r.assigned("u", "g2")
    r.record_outcome("u", None)
    r.assigned("none", None)  # no cluster yet (before the first clustering)
    r.record_outcome("none", True)
    r.assigned("gone", "g9")  # not a live cluster
    r.record_outcome("gone", True)
    r.record_outcome("never-seen", True)
    assert r.counts("g1") == r.counts("g2") == r.counts("g9") == (0, 0)


def test_nothing_counts_before_the_first_clustering() -> None:
    r = CompletionRates(100, Reservoir(10))
    r.assigned("a", "g1")
    r.record_outcome("a", True)
    assert r.counts("g1") == (0, 0)


def test_verdicts_are_stamped_on_the_reservoir_sample_in_either_order() -> None:
    r, reservoir = rates()
    reservoir.offer(item("first"))
    r.record_outcome("first", True)  # held already: stamped at once
    r.record_outcome("second", False)
    reservoir.offer(item("second"))
    r.assigned("second", None)  # held after its verdict: stamped at assignment
    held = {it.conversation_id: it.complete for it in reservoir.items()}
    assert held == {"first": True, "second": False}


def test_restart_counts_the_sample_and_never_recounts_earlier_verdicts() -> None:
    r, _ = rates()
    r.assigned("a", "g1")
    r.record_outcome("a", True)
    r.record_outcome("late", False)  # its verdict is known before the new clustering
    r.restart(["n1", "n2"], [("n1", True), ("n1", False), ("n1", None), ("n2", True)])
    assert r.counts("n1") == (1, 1) and r.counts("n2") == (1, 0)
    assert r.counts("g1") == (0, 0)  # retired with its cluster
    r.assigned("late", "n2")  # assigned after the run: already in (or out of) the sample
    r.assigned("fresh", "n2")
    r.record_outcome("fresh", False)
    assert r.counts("n2") == (1, 1)


def test_memory_is_bounded_least_recently_touched_first_out() -> None:
    r, _ = rates(capacity=3)
    for c in ("a", "b", "c"):
        r.assigned(c, "g1")
    r.record_outcome("a", True)  # touches a: b is now the oldest
    r.assigned("d", "g1")  # forgets b
    r.record_outcome("c", False)
    r.record_outcome("b", True)  # b is a stranger now: its verdict waits for an assignment
    assert r.counts("g1") == (1, 1)
