"""The fleet's goal records (inputs and the model) and the model's plan/load: round trips, ids kept
by a leader's plan, and every kind of hostile record refused with InvalidRow."""

from __future__ import annotations

import base64
import json
from typing import Any

import numpy as np
import pytest

from sidecar.clustering.algorithm import ClusteringResult
from sidecar.clustering.config import ClusteringConfig
from sidecar.clustering.embed import normalize_rows
from sidecar.clustering.model import GoalModel
from sidecar.clustering.records import (
    MAX_DIMENSIONS,
    FleetGoalModel,
    GoalInput,
    ModelCluster,
    decode_input,
    decode_model,
    encode_input,
    encode_model,
)
from sidecar.clustering.reservoir import ReservoirItem
from sidecar.fleet.table import InvalidRow
from tests.clustering.test_live import GOALS, feed, make


def _unit(seed: int, dim: int = 16) -> np.ndarray:
    return np.asarray(normalize_rows(np.random.default_rng(seed).normal(size=(1, dim)))[0], dtype=np.float32)


def _model(**kw: Any) -> FleetGoalModel:
    base: dict[str, Any] = {
        "generation": 3,
        "version": 2,
        "prefix": "ab12cd-g",
        "next_number": 4,
        "clusters": (
            ModelCluster("ab12cd-g1", "book a flight", 40, _unit(1)),
            ModelCluster("ab12cd-g3", None, 2, _unit(2)),
        ),
    }
    base.update(kw)
    return FleetGoalModel(**base)


def test_records_round_trip() -> None:
    item = GoalInput("conv-1", "book a flight to Lyon ✈", _unit(0))
    back = decode_input(encode_input(item))
    assert (back.conversation_id, back.summary) == (item.conversation_id, item.summary)
    assert np.array_equal(back.vector, item.vector)
    model = _model()
    got = decode_model(encode_model(model))
    assert (got.generation, got.version, got.prefix, got.next_number) == (3, 2, "ab12cd-g", 4)
    assert [(c.id, c.label, c.size) for c in got.clusters] == [
        ("ab12cd-g1", "book a flight", 40),
        ("ab12cd-g3", None, 2),
    ]
    assert all(np.array_equal(a.centroid, b.centroid) for a, b in zip(got.clusters, model.clusters, strict=True))


def _raw_model(**changes: Any) -> bytes:
    obj = json.loads(encode_model(_model()))
    for path, value in changes.items():
        target = obj
        *parents, leaf = path.split(".")
        for p in parents:
            target = target[int(p)] if p.isdigit() else target[p]
        target[int(leaf) if leaf.isdigit() else leaf] = value
    return json.dumps(obj).encode()


def _b64(values: list[float]) -> str:
    return base64.b64encode(np.asarray(values, dtype="<f4").tobytes()).decode()


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"not json",
        b"[1, 2]",
        b'{"schema": 2}',
        b"[" * 100_000,
        _raw_model(generation=-1),
        _raw_model(generation=True),
        _raw_model(version="1"),
        _raw_model(next_number=0),
        _raw_model(prefix="<script>"),
        _raw_model(prefix=""),
        _raw_model(clusters="many"),
        _raw_model(clusters=[1]),
        _raw_model(**{"clusters.0.id": "a b"}),
        _raw_model(**{"clusters.0.id": "x" * 65}),
        _raw_model(**{"clusters.1.id": "ab12cd-g1"}),  # an id twice
        _raw_model(**{"clusters.0.label": 7}),
        _raw_model(**{"clusters.0.label": "x" * 201}),
        _raw_model(**{"clusters.0.size": -1}),
        _raw_model(**{"clusters.0.size": 1.5}),
        _raw_model(**{"clusters.0.centroid": "%%%"}),
        _raw_model(**{"clusters.0.centroid": base64.b64encode(b"abc").decode()}),  # not float32s
        _raw_model(**{"clusters.0.centroid": _b64([float("nan")] * 16)}),
        _raw_model(**{"clusters.0.centroid": _b64([1e30] * 16)}),
        _raw_model(**{"clusters.0.centroid": _b64([0.1] * 16)}),  # not a unit vector
        _raw_model(**{"clusters.0.centroid": _b64([1.0] + [0.0] * 7)}),  # another dimension
        _raw_model(**{"clusters.0.centroid": _b64([0.0] * (MAX_DIMENSIONS + 1))}),
        _raw_model(clusters=[{"id": f"g{i}", "label": None, "size": 1, "centroid": _b64([1.0])} for i in range(1001)]),
    ],
)
def test_hostile_models_are_refused(raw: bytes) -> None:
    with pytest.raises(InvalidRow):
        decode_model(raw)


@pytest.mark.parametrize(
    "obj",
    [
        {"schema": 1, "id": "", "summary": "s", "vector": _b64([1.0])},
        {"schema": 1, "id": "c" * 513, "summary": "s", "vector": _b64([1.0])},
        {"schema": 1, "id": "c", "summary": "", "vector": _b64([1.0])},
        {"schema": 1, "id": "c", "summary": "s" * 20_001, "vector": _b64([1.0])},
        {"schema": 1, "id": "c", "summary": "s", "vector": _b64([float("inf")])},
        {"schema": 1, "id": "c", "summary": "s", "vector": _b64([0.5, 0.5])},  # not a unit vector
        {"schema": 1, "id": "c", "summary": "s", "vector": [1.0]},
        {"schema": 1, "id": 5, "summary": "s", "vector": _b64([1.0])},
        {"id": "c", "summary": "s", "vector": _b64([1.0])},
    ],
)
def test_hostile_inputs_are_refused(obj: dict[str, Any]) -> None:
    with pytest.raises(InvalidRow):
        decode_input(json.dumps(obj).encode())


def _result(centers: np.ndarray, sizes: list[int], labels: list[str]) -> ClusteringResult:
    assignments = np.concatenate([np.full(s, i) for i, s in enumerate(sizes)])
    return ClusteringResult(len(sizes), labels, assignments, centers.astype(np.float32), sizes)


def test_a_plan_changes_nothing_and_load_gives_every_replica_the_same_ids() -> None:
    cfg = ClusteringConfig(enabled=True, min_conversations_per_name=5, top_n_labels=2)
    leader, follower = GoalModel(cfg), GoalModel(cfg)
    centers = normalize_rows(np.eye(3, 16))
    plan = leader.plan(_result(centers, [30, 20, 3], ["book flight", "rent car", "tiny"]))
    assert len(leader) == 0  # nothing applied by planning
    ids = [c.id for c in plan.clusters]
    assert len(set(ids)) == 3 and plan.next_number == 4 and all(i.startswith(plan.prefix) for i in ids)
    for model in (leader, follower):
        assert model.load(plan) == ids
    assert [(c.id, c.goal, c.name, c.size) for c in leader.clusters()] == [
        (c.id, c.goal, c.name, c.size) for c in follower.clusters()
    ]
    assert [c.goal for c in follower.clusters()] == [ids[0], ids[1], "other"]
    assert follower.clusters()[2].name == "unnamed"  # 3 conversations: too small to name
    # The follower leads next: same goals, moved a little, plus a new one keep their ids; the new
    # one gets the fleet's next number, never a number the first leader handed out.
    moved = normalize_rows(np.vstack([centers + 0.05, np.eye(1, 16, 5)]))
    second = follower.plan(_result(moved, [40, 25, 4, 12], ["book flight", "rent car", "tiny", "weather"]))
    assert [c.id for c in second.clusters][:3] == ids
    assert second.clusters[3].id == f"{plan.prefix}4" and second.next_number == 5


async def test_a_run_keeps_the_most_common_dimension() -> None:
    """An input of another dimension (another replica's embedder) in the reservoir must not make
    every run fail: the run clusters the most common dimension's conversations."""
    gc = make()
    await feed(gc, list(GOALS), 6)
    gc.scheduler.offer(ReservoirItem("odd", "odd one", np.ones(3, dtype=np.float32) / np.sqrt(3)))
    assert await gc.recluster("manual")
    assert sum(c.size for c in gc.model.clusters()) == 6 * len(GOALS)
