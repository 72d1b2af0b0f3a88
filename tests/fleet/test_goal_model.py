"""One goal model for three replicas (``clustering.fleet``), in one process against librdkafka's
mock cluster: every replica's inputs reach every reservoir, only the leader re-clusters, all three
apply the same model (ids, names, sizes, centroids), a new leader keeps the ids, and a model
written late by a superseded leader is refused everywhere. The three-process version with kills
and stops runs on Tansu (tests/replicas/test_goal_fleet.py)."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Iterator, Sequence

import numpy as np
import pytest
from prometheus_client import CollectorRegistry
from sklearn.metrics import adjusted_rand_score

from sidecar.clustering.live import GoalClusterer
from sidecar.clustering.llm import ExtractiveGoalLLM, extractive_summary
from sidecar.clustering.records import FleetGoalModel, GoalInput, encode_input, encode_model
from sidecar.contract import TurnContext
from sidecar.fleet.leadership import Leadership
from sidecar.fleet.publisher import TablePublisher
from sidecar.source.config import KafkaConfig
from sidecar.tools.demo.mock_cluster import MockKafkaCluster
from sidecar.tools.demo.replay import load_sample
from sidecar.transcript.model import Message
from tests.clustering.fakes import HashEmbedder
from tests.clustering.test_live import GOALS, config, conv, ended

WAIT_SECONDS = 30.0


@pytest.fixture(scope="module")
def bootstrap() -> Iterator[str]:
    with MockKafkaCluster(1) as cluster:
        yield cluster.bootstrap_servers


async def _until(what: str, check: Callable[[], bool], state: Callable[[], object] = lambda: "") -> None:
    deadline = time.monotonic() + WAIT_SECONDS
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"not within {WAIT_SECONDS:.0f} s: {what} {state()}")
        await asyncio.sleep(0.05)


async def _publish(kafka: KafkaConfig, topic: str, key: str, value: bytes) -> None:
    publisher = TablePublisher(topic, kafka)
    try:
        await publisher.publish(key, value, timeout_seconds=10)
    finally:
        await publisher.stop()


def _held(gc: GoalClusterer) -> int:
    """Conversations in a replica's reservoir (what ``/clusters`` shows)."""
    return int(gc.snapshot()["reservoir_conversations"])


def _shape(gc: GoalClusterer) -> list[tuple[str, str, str, int]]:
    return [(c.id, c.goal, c.name, c.size) for c in gc.model.clusters()]


def _model(gc: GoalClusterer) -> FleetGoalModel | None:
    assert gc.fleet is not None
    return gc.fleet.table.get("model")


def _generation(gc: GoalClusterer) -> int | None:
    model = _model(gc)
    return None if model is None else model.generation


def _same_model(replicas: Sequence[GoalClusterer], *, generation: int) -> bool:
    """Every replica holds the same model row, of ``generation``."""
    rows = {(m.generation, m.version) if (m := _model(gc)) is not None else None for gc in replicas}
    return len(rows) == 1 and None not in rows and next(iter(rows))[0] == generation  # type: ignore[index]


async def _feed(replicas: Sequence[GoalClusterer], per_goal: int, start: int = 0) -> int:
    """Conversations of every goal, ended round-robin on the replicas; how many."""
    n = 0
    for i in range(start, start + per_goal):
        for goal in GOALS:
            await ended(replicas[n % len(replicas)], conv(goal, i))
            n += 1
    return n


async def test_three_replicas_share_one_goal_model_across_a_handover_and_a_late_leader(bootstrap: str) -> None:
    run = uuid.uuid4().hex[:8]
    # No drift runs; the leader's first run may still come from its own loop ("initial") as well as
    # from the test, so the checks wait for one model everywhere rather than for a version.
    topics = {"model_topic": f"goals-{run}", "inputs_topic": f"inputs-{run}"}
    cfg = config(fleet={"enabled": True, **topics}, drift_min_assignments=10**6)
    kafka = KafkaConfig(bootstrap_servers=bootstrap, topic=f"events-{run}")
    leaders = [Leadership() for _ in range(3)]
    registries = [CollectorRegistry() for _ in range(3)]
    replicas = [
        GoalClusterer(
            cfg, reg, llm=ExtractiveGoalLLM(cfg), embedder=HashEmbedder(dim=512), kafka=kafka, leadership=lead
        )
        for lead, reg in zip(leaders, registries, strict=True)
    ]
    for i, lead in enumerate(leaders):
        lead.assigned([i], 1, f"member-{i}")  # replica 0 owns partition 0: it leads generation 1
    for gc in replicas:
        await gc.start()
    try:
        # Hostile records on the inputs topic are counted and skipped by every replica.
        zero = b'{"schema": 1, "id": "x", "summary": "s", "vector": "AAAAAA=="}'  # not a unit vector
        for value in (b"junk", zero, b"{" * 300_000):
            await _publish(kafka, cfg.fleet.topics(kafka.topic)[1], "hostile", value)
        invalid = {"outcome": "invalid"}
        await _until(
            "every replica counted the hostile inputs",
            lambda: all(r.get_sample_value("sidecar_goal_fleet_inputs_total", invalid) == 3 for r in registries),
            lambda: [r.get_sample_value("sidecar_goal_fleet_inputs_total", invalid) for r in registries],
        )
        sent = await _feed(replicas, 6)
        await _until("every reservoir holds every replica's inputs", lambda: all(_held(gc) == sent for gc in replicas))
        # A well-formed input of another embedding's dimension is refused too.
        await _publish(
            kafka,
            cfg.fleet.topics(kafka.topic)[1],
            "other-dimension",
            encode_input(GoalInput("od", "s", np.ones(1, np.float32))),
        )
        await _until(
            "every replica refused the other dimension",
            lambda: all(r.get_sample_value("sidecar_goal_fleet_inputs_total", invalid) == 4 for r in registries),
        )
        assert all(_held(gc) == sent for gc in replicas)
        assert not await replicas[1].recluster("manual")  # a follower never runs
        assert registries[1].get_sample_value(
            "sidecar_clustering_runs_total", {"trigger": "manual", "result": "not_leader"}
        ) == 1.0  # fmt: skip
        assert await replicas[0].recluster("manual")
        await _until("all three applied the leader's model", lambda: _same_model(replicas, generation=1))
        first = _shape(replicas[0])
        assert len(first) >= 3
        for gc in replicas[1:]:
            assert _shape(gc) == first
            assert np.array_equal(gc.model.centroids(), replicas[0].model.centroids())
        # The same conversation gets the same goal on every replica.
        probe = conv("flight", 99)
        labels = {await gc.goal_label(probe) for gc in replicas}
        assert len(labels) == 1 and labels != {"unknown"}
        assert all("model generation=1 version=" in gc.health().detail for gc in replicas)

        # Handover: replica 1 is given partition 0 in generation 2; more of the same goals arrive.
        leaders[0].revoked()
        leaders[1].assigned([0, 1], 2, "member-1")
        sent += await _feed(replicas, 4, start=6) + 1  # + the probe
        await _until("the new inputs reached replica 1", lambda: _held(replicas[1]) == sent)
        assert await replicas[1].recluster("manual")
        await _until("all three applied generation 2", lambda: _same_model(replicas, generation=2))
        second = _shape(replicas[1])
        assert {cid for cid, *_ in first} <= {cid for cid, *_ in second}  # the goals kept their ids
        assert all(_shape(gc) == second for gc in replicas)

        # The old leader wakes up believing it still leads generation 1: its run is refused before
        # it writes, and a model it had written late is refused by every replica (fenced).
        leaders[0].assigned([0], 1, "member-0")
        assert not await replicas[0].recluster("manual")
        assert leaders[0].term is None  # it read generation 2 and stepped down
        stale = {"table": "goals", "outcome": "stale"}
        before = [r.get_sample_value("sidecar_fleet_table_records_total", stale) or 0.0 for r in registries]
        late = FleetGoalModel(1, 99, "zz-g", 1, ())
        await _publish(kafka, cfg.fleet.topics(kafka.topic)[0], "model", encode_model(late))
        await _until(
            "every replica refused the late model",
            lambda: all(
                r.get_sample_value("sidecar_fleet_table_records_total", stale) == b + 1
                for r, b in zip(registries, before, strict=True)
            ),
            lambda: [
                {
                    o: r.get_sample_value("sidecar_fleet_table_records_total", {"table": "goals", "outcome": o})
                    for o in ("applied", "stale", "invalid", "full")
                }
                for r in registries
            ],
        )
        assert all(_shape(gc) == second and _generation(gc) == 2 for gc in replicas)
    finally:
        for gc in replicas:
            await gc.stop()


def _sample_conversations(n: int) -> list[TurnContext]:
    out = []
    for i, record in enumerate(load_sample()[:n]):
        messages = tuple(
            Message("user" if t["role"] == "user" else "assistant", t["content"])
            for t in record["turns"]
            if t.get("content")
        )
        out.append(
            TurnContext("conversation_ended", f"s{i}", len(messages), messages, "agent", None, end_reason="end_event")
        )
    return out


async def test_the_fleets_clustering_equals_a_single_replicas_on_the_same_conversations(bootstrap: str) -> None:
    """150 conversations of the bundled sample, ended round-robin on three fleet replicas and all on
    one replica of its own: the leader's model (read back on a follower) assigns them as the single
    replica's does (ARI against it), though the leader read them in another order."""
    run = uuid.uuid4().hex[:8]
    base = {"mode": "extractive", "k1": 8, "min_conversations": 20, "drift_min_assignments": 10**6}
    cfg = config(fleet={"enabled": True, "model_topic": f"goals-{run}", "inputs_topic": f"inputs-{run}"}, **base)
    single_cfg = config(**base)
    embedder = HashEmbedder(dim=512)
    kafka = KafkaConfig(bootstrap_servers=bootstrap, topic=f"events-{run}")
    leaders = [Leadership() for _ in range(3)]
    for i, lead in enumerate(leaders):
        lead.assigned([i], 1, f"member-{i}")
    replicas = [
        GoalClusterer(
            cfg, CollectorRegistry(), llm=ExtractiveGoalLLM(cfg), embedder=embedder, kafka=kafka, leadership=lead
        )
        for lead in leaders
    ]
    single = GoalClusterer(single_cfg, CollectorRegistry(), llm=ExtractiveGoalLLM(single_cfg), embedder=embedder)
    conversations = _sample_conversations(150)
    for gc in replicas:
        await gc.start()
    try:
        for n, c in enumerate(conversations):
            await ended(replicas[n % 3], c)
            await ended(single, c)
        await _until("the leader holds every input", lambda: _held(replicas[0]) == len(conversations))
        assert await replicas[0].recluster("manual") and await single.recluster("manual")
        assert replicas[0].fleet is not None
        written = replicas[0].fleet.last_written
        await _until("the follower applied the last model", lambda: _row(replicas[2]) == written)
        vectors = embedder.embed([extractive_summary(c.messages, cfg.max_summary_chars) for c in conversations])
        fleet_goals = [replicas[2].model.nearest(v) for v in vectors]
        single_goals = [single.model.nearest(v) for v in vectors]
        assert len(fleet_goals) == len(conversations)
        ari = adjusted_rand_score([g[0] for g in fleet_goals if g], [g[0] for g in single_goals if g])
        print(f"fleet vs single replica: ARI {ari:.3f} over {len(conversations)} conversations")
        assert ari >= 0.95
    finally:
        for gc in replicas:
            await gc.stop()


def _row(gc: GoalClusterer) -> tuple[int, int] | None:
    model = _model(gc)
    return None if model is None else (model.generation, model.version)
