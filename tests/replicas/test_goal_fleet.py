"""One goal model for a fleet of real processes: three ``sidecar run`` in one group on Tansu with
``clustering.fleet`` on, over conversations of the bundled sample replayed under fresh ids.

1. Every replica serves the same goal model (``/clusters``: ids, names, sizes; the same model row).
2. SIGKILL the leader: a new leader (a higher group generation) publishes the next model, keeping
   the ids of the last one it read and counting new ids on from that model's counter.
3. SIGSTOP the new leader past its session timeout, let a successor publish, SIGCONT it: no replica
   ever serves a model of an older generation than one it served before, and all end on the
   successor's (a late model of the woken leader, if it wrote one, is counted stale everywhere).
   No run counts as an error: a leader that finds itself superseded steps down (``not_leader``).

Scoring is off (no vLLM needed); clustering is LLM-free (extractive) with the bundled embedder.
"""

from __future__ import annotations

import json
import os
import re
import signal
from pathlib import Path
from typing import Any

from sidecar.tools.demo.replay import conversation_events, encode, interleave, load_sample
from tests.integration.kafka_support import http_get, produce_raw
from tests.replicas.fleet import Fleet, Replica
from tests.support.tansu import TansuBroker

PARTITIONS = 6
TOPIC = "fleet-goals"
SESSION_TIMEOUT_MS = 6000
BATCHES = 3
PER_BATCH = 40
_NUMBER = re.compile(r"(\d+)$")


def _clusters(replica: Replica) -> dict[str, Any] | None:
    try:
        status, body = http_get(replica.url + "/clusters")
    except OSError:
        return None
    return json.loads(body) if status == 200 else None


# A replica's model as /clusters shows it: (generation, version) and (id, name, size) per cluster.
Model = tuple[tuple[int, int], list[tuple[str, str, int]]]


def _model(snapshot: dict[str, Any] | None) -> Model | None:
    """(generation, version) of the model row a replica applied, and its clusters."""
    if snapshot is None or snapshot["fleet"] is None or snapshot["fleet"]["model_generation"] is None:
        return None
    row = (snapshot["fleet"]["model_generation"], snapshot["fleet"]["model_version"])
    return row, [(c["id"], c["name"], c["size"]) for c in snapshot["clusters"]]


class Watch:
    """Every model each replica served, in the order seen: generations never go back."""

    def __init__(self) -> None:
        self.seen: dict[str, list[tuple[int, int]]] = {}

    def models(self, replicas: list[Replica]) -> dict[str, Model | None]:
        out = {}
        for r in replicas:
            model = _model(_clusters(r))
            out[r.name] = model
            if model is not None:
                history = self.seen.setdefault(r.name, [])
                assert not history or model[0] >= history[-1], f"{r.name} went back from {history[-1]} to {model[0]}"
                if not history or history[-1] != model[0]:
                    history.append(model[0])
        return out


def _leader(replicas: list[Replica]) -> Replica:
    leaders = [
        r for r in replicas if (s := r.scrape()) is not None and s.check("leadership")["detail"].startswith("leader")
    ]
    assert len(leaders) == 1, [r.name for r in leaders]
    return leaders[0]


async def _one_model(fleet: Fleet, watch: Watch, *, newer_than: tuple[int, int], what: str) -> Model:
    """Wait until every live replica serves one same model, newer than ``newer_than``."""
    found: dict[str, Model | None] = {}

    def same() -> bool:
        found.update(watch.models(fleet.live()))
        models = [found[r.name] for r in fleet.live()]
        return all(m is not None and m[0] > newer_than for m in models) and len({json.dumps(m) for m in models}) == 1

    await fleet.wait(same, 240, what)
    model = found[fleet.live()[0].name]
    assert model is not None
    return model


def _numbers(ids: list[str]) -> set[int]:
    return {int(m.group(1)) for i in ids if (m := _NUMBER.search(i))}


async def test_three_processes_serve_one_goal_model_through_a_kill_and_a_stopped_leader(
    tansu: TansuBroker, tmp_path: Path
) -> None:
    bs = tansu.bootstrap_servers
    await tansu.create_topics([TOPIC, f"{TOPIC}.results", f"{TOPIC}.dlq"], PARTITIONS)
    sample = load_sample()
    streams = []
    for b in range(BATCHES):
        records = sample[b * PER_BATCH : (b + 1) * PER_BATCH]
        convs = [conversation_events(r, agent="shop", conversation_id=f"goal-{b}-{i}") for i, r in enumerate(records)]
        streams.append([encode(e) for e in interleave(convs, concurrency=10, seed=b)])
    fleet = Fleet(
        tmp_path,
        bs,
        TOPIC,
        PARTITIONS,
        {
            "kafka": {"session_timeout_ms": SESSION_TIMEOUT_MS},
            "scoring": {"enabled": False},
            "clustering": {
                "enabled": True,
                "mode": "extractive",
                "k1": 8,
                "min_conversations": 20,
                "recluster_interval_seconds": 2,
                "drift_min_assignments": 1_000_000,
                "fleet": {"enabled": True, "replication_factor": 1},
            },
        },
    )
    watch = Watch()
    try:
        for name in ("a", "b", "c"):
            fleet.start(name)
        await fleet.settled(180)
        await produce_raw(bs, TOPIC, streams[0])

        # 1. One model on every replica.
        row1, clusters1 = await _one_model(fleet, watch, newer_than=(0, 0), what="one goal model on all three")
        assert clusters1, "the leader published a model without clusters"
        first_leader = _leader(fleet.live())
        ids1 = [cid for cid, _, _ in clusters1]

        # 2. SIGKILL the leader; the next leader's model keeps ids and counts on.
        first_leader.proc.kill()
        await fleet.settled(180)
        await produce_raw(bs, TOPIC, streams[1])
        row2, clusters2 = await _one_model(fleet, watch, newer_than=(row1[0], 1 << 62), what="a new leader's model")
        ids2 = [cid for cid, _, _ in clusters2]
        assert set(ids1) & set(ids2), (clusters1, clusters2)  # goals kept their ids across leaders
        fresh = set(ids2) - set(ids1)
        assert all(n > max(_numbers(ids1)) for n in _numbers(sorted(fresh))), (ids1, ids2)

        # 3. SIGSTOP the leader past its session timeout; a successor publishes; SIGCONT.
        stopped = _leader(fleet.live())
        assert stopped.proc.proc is not None
        os.kill(stopped.proc.proc.pid, signal.SIGSTOP)
        try:
            others = [r for r in fleet.live() if r is not stopped]
            await produce_raw(bs, TOPIC, streams[2])

            def successor_published() -> bool:
                models = watch.models(others)
                return all(m is not None and m[0][0] > row2[0] for m in models.values())

            await fleet.wait(successor_published, 240, "the successor's model")
        finally:
            os.kill(stopped.proc.proc.pid, signal.SIGCONT)
        row3, clusters3 = await _one_model(fleet, watch, newer_than=row2, what="all three on the successor's model")
        assert row3[0] > row2[0]
        stale = sum(
            s.value("sidecar_fleet_table_records_total", table="goals", outcome="stale")
            for r in fleet.live()
            if (s := r.scrape()) is not None
        )
        runs = {
            r.name: {res: s.value("sidecar_clustering_runs_total", result=res) for res in ("ok", "not_leader", "error")}
            for r in fleet.live()
            if (s := r.scrape()) is not None
        }
        assert all(counts["error"] == 0 for counts in runs.values()), runs
    finally:
        fleet.stop_all()
    print(  # the figures of the run, for the record
        f"models: {row1} -> {row2} -> {row3}; goals {len(clusters1)} -> {len(clusters2)} -> {len(clusters3)}; "
        f"ids kept across the kill {len(set(ids1) & set(ids2))}/{len(ids1)}; stale records read {stale:g}; "
        f"served: {watch.seen}; runs by replica: {runs}"
    )
