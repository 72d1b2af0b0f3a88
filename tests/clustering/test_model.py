"""The live goal model: stable ids across results, bounded goal values, names, nearest assignment."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from sidecar.clustering.algorithm import ClusteringResult
from sidecar.clustering.config import ClusteringConfig
from sidecar.clustering.embed import Matrix, normalize_rows
from sidecar.clustering.ids import ClusterIdRegistry
from sidecar.clustering.metrics import ClusteringMetrics
from sidecar.clustering.model import OTHER, UNKNOWN, UNNAMED, GoalModel, metric_label

DIM = 8


def axis(i: int, tilt: float = 0.0) -> Matrix:
    """The unit vector along axis ``i``, tilted a little towards the next axis."""
    v = np.zeros(DIM, dtype=np.float32)
    v[i] = 1.0
    v[(i + 1) % DIM] = tilt
    return normalize_rows(v[None, :])[0]


def result(axes: Sequence[int], sizes: Sequence[int], labels: Sequence[str], tilt: float = 0.0) -> ClusteringResult:
    """A re-clustering result with one centroid per axis, clusters numbered by decreasing size."""
    assignments = np.repeat(np.arange(len(sizes)), sizes).astype(np.int64)
    centroids = np.stack([axis(a, tilt) for a in axes]).astype(np.float32)
    return ClusteringResult(len(sizes), list(labels), assignments, centroids, list(sizes))


def model(**kw: int) -> GoalModel:
    cfg = ClusteringConfig(top_n_labels=kw.get("top_n", 2), min_conversations_per_name=kw.get("per_name", 2))
    return GoalModel(cfg, ClusterIdRegistry(prefix="t-g"))


def test_metric_label_is_safe() -> None:
    assert metric_label('Book "Flights"\n{x="1"}', 48) == "book flights x 1"
    assert len(metric_label("a" * 500, 48)) == 48
    assert metric_label("", 48) == "unnamed" and metric_label("Other", 48) == "unnamed"


def test_an_empty_model_assigns_nothing_and_every_goal_is_unknown() -> None:
    m = model()
    assert len(m) == 0 and m.clusters() == []
    assert m.nearest(axis(0)) is None
    assert m.goal_of(None) == UNKNOWN and m.goal_of("t-g1") == UNKNOWN
    assert "t-g1" not in m


def test_apply_names_big_clusters_and_bounds_goal_values_to_the_top_n() -> None:
    m = model(top_n=2, per_name=2)
    ids = m.apply(result([0, 1, 2], [5, 3, 1], ['Book "Flights"', "Bank Transfer", "zebediah 5551234"]))
    assert ids == ["t-g1", "t-g2", "t-g3"] and len(m) == 3
    assert [c.id for c in m.clusters()] == ids  # largest first
    first, second, lone = m.clusters()
    assert (first.goal, first.name, first.label) == ("t-g1", "book flights", 'Book "Flights"')
    assert (second.goal, second.name) == ("t-g2", "bank transfer")
    # Past the top N the goal value is `other`; below the naming floor the words never show.
    assert (lone.goal, lone.name, lone.label) == (OTHER, UNNAMED, None)
    assert [m.goal_of(c) for c in ids] == ["t-g1", "t-g2", OTHER]
    assert m.goal_of("t-g9") == UNKNOWN


def test_nearest_picks_the_closest_centroid_and_counts_the_assignment() -> None:
    m = model()
    m.apply(result([0, 1, 2], [5, 3, 2], ["a", "b", "c"]))
    hit = m.nearest(axis(1, tilt=0.2))
    assert hit is not None
    cid, distance = hit
    assert cid == "t-g2"
    assert distance == pytest.approx(float(np.linalg.norm(axis(1, tilt=0.2) - axis(1))), abs=1e-5)
    m.nearest(axis(1))
    assert [c.assigned_since for c in m.clusters()] == [0, 2, 0]


def test_ids_follow_their_centroids_across_results_and_are_never_reused() -> None:
    m = model(top_n=3)
    m.apply(result([0, 1, 2], [5, 4, 3], ["flights", "bank", "weather"]))
    m.nearest(axis(0))
    # Next run: the bank cluster grew to first place, weather is gone, a new goal appears.
    ids = m.apply(result([1, 0, 3], [9, 5, 2], ["bank", "flights", "cars"], tilt=0.1))
    assert ids == ["t-g2", "t-g1", "t-g4"]  # t-g3 is retired, the new cluster gets a fresh number
    assert [c.goal for c in m.clusters()] == ids
    assert all(c.assigned_since == 0 for c in m.clusters())  # counted since this clustering
    assert "t-g3" not in m and m.goal_of("t-g3") == UNKNOWN
    assert m.apply(result([5], [4], ["new"])) == ["t-g5"]  # nothing similar: nothing inherited


def test_ids_carry_a_random_prefix_per_model() -> None:
    cfg = ClusteringConfig()
    a, b = GoalModel(cfg), GoalModel(cfg)
    res = result([0], [5], ["x"])
    id_a, id_b = a.apply(res)[0], b.apply(res)[0]
    assert id_a.endswith("-g1") and id_b.endswith("-g1") and id_a != id_b


def test_publish_sets_sizes_per_goal_and_names_beside_the_ids() -> None:
    m = model(top_n=1, per_name=2)
    metrics = ClusteringMetrics(CollectorRegistry())
    m.apply(result([0, 1, 2], [5, 3, 1], ["flights", "bank", "lone"]))
    m.publish(metrics)
    sizes = {s.labels["goal"]: s.value for f in metrics.cluster_size.collect() for s in f.samples}
    info = {s.labels["goal"]: s.labels["name"] for f in metrics.goal_info.collect() for s in f.samples}
    assert sizes == {"t-g1": 5, OTHER: 4}
    assert info == {"t-g1": "flights"}  # `other` has no name
    assert metrics.clusters._value.get() == 3
    m.apply(result([3], [6], ["cars"]))
    m.publish(metrics)  # the previous series are cleared, not left behind
    sizes = {s.labels["goal"]: s.value for f in metrics.cluster_size.collect() for s in f.samples}
    info = {s.labels["goal"]: s.labels["name"] for f in metrics.goal_info.collect() for s in f.samples}
    assert sizes == {"t-g4": 6} and info == {"t-g4": "cars"} and metrics.clusters._value.get() == 1


def test_as_json_carries_the_completion_counts() -> None:
    m = model()
    m.apply(result([0], [5], ["flights"]))
    (info,) = m.clusters()
    doc = info.as_json(3, 1)
    assert list(doc) == [
        "id", "goal", "name", "label", "size", "assigned_since_clustering", "complete", "incomplete",
        "completion_rate",
    ]  # fmt: skip
    assert (doc["complete"], doc["incomplete"], doc["completion_rate"]) == (3, 1, 0.75)
    assert info.as_json(0, 0)["completion_rate"] is None
