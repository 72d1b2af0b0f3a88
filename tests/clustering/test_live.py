"""The live component: hooks, bounded labels, outcomes, re-clustering with stable ids, drift."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from sidecar.clustering.config import ClusteringConfig
from sidecar.clustering.embed import Matrix
from sidecar.clustering.live import OTHER, UNKNOWN, GoalClusterer
from sidecar.clustering.llm import ExtractiveGoalLLM, MergeQuery, extractive_summary
from sidecar.contract import ConversationHooks, Outcome, TurnContext
from sidecar.errors import RetryableError
from sidecar.lifecycle import Component, HealthReporter
from sidecar.transcript.model import Message
from tests.clustering.fakes import HashEmbedder

GOALS = {
    "flight": "book flight airline ticket airport departure",
    "restaurant": "reserve restaurant table dinner cuisine",
    "car": "rent car vehicle pickup rental",
    "weather": "weather forecast rain sunny temperature",
    "bank": "bank account balance transfer money",
}


def ctx(cid: str, *user_texts: str) -> TurnContext:
    msgs: list[Message] = []
    for t in user_texts:
        msgs += [Message("user", t), Message("assistant", "ok, anything else?")]
    return TurnContext("conversation_ended", cid, len(user_texts), tuple(msgs), "agent", None, end_reason="end_event")


def conv(goal: str, i: int) -> TurnContext:
    words = GOALS[goal].split()
    rot = words[i % len(words) :] + words[: i % len(words)]
    return ctx(f"{goal}-{i}", " ".join(rot[:4]), f"also {rot[-1]} please")


async def ended(gc: GoalClusterer, c: TurnContext) -> Outcome:
    result = gc.on_conversation_ended(c)
    return result if isinstance(result, Mapping) else await result


def config(**kw: Any) -> ClusteringConfig:
    base: dict[str, Any] = {
        "enabled": True,
        "k1": 8,
        "min_conversations": 20,
        "reservoir_size": 400,
        "recluster_interval_seconds": 3600,
        "keyword_min_document_frequency": 2,
        "merge_similarity_threshold": 0.7,
        "top_n_labels": 10,
        "drift_min_assignments": 20,
    }
    base.update(kw)
    return ClusteringConfig(**base)


def make(cfg: ClusteringConfig | None = None, **kw: Any) -> GoalClusterer:
    cfg = cfg or config()
    return GoalClusterer(
        cfg,
        CollectorRegistry(),
        llm=kw.pop("llm", ExtractiveGoalLLM(cfg)),
        embedder=kw.pop("embedder", HashEmbedder(dim=512)),
    )


async def feed(gc: GoalClusterer, goals: Sequence[str], per_goal: int, start: int = 0) -> list[str]:
    labels = []
    for i in range(start, start + per_goal):
        for g in goals:
            labels.append(await gc.goal_label(conv(g, i)))
    return labels


def test_protocols() -> None:
    gc = make()
    assert isinstance(gc, Component) and isinstance(gc, HealthReporter)
    hooks: ConversationHooks = gc
    assert hooks is gc


async def test_before_any_clustering_labels_are_unknown_then_first_run_starts_by_itself() -> None:
    gc = make()
    await gc.start()
    try:
        out = await ended(gc, conv("flight", 0))
        assert out == {"goal_id": None, "goal": UNKNOWN}
        await feed(gc, ["flight", "restaurant", "car"], 8, start=1)
        for _ in range(200):
            if gc.snapshot()["clusters"]:
                break
            await asyncio.sleep(0.05)
        snap = gc.snapshot()
        assert snap["runs"] == 1 and snap["last_run"]["trigger"] == "initial"
        assert {c["size"] for c in snap["clusters"]} and len(snap["clusters"]) == 3
        out = await ended(gc, conv("car", 99))
        assert out["goal_id"] in {c["id"] for c in snap["clusters"]}
        assert out["goal"] == out["goal_id"]  # the metric value is the stable id, never words
        named = next(c for c in snap["clusters"] if c["id"] == out["goal_id"])
        assert "car" in named["name"] and "car" in named["label"]
        assert json.loads(json.dumps(snap)) == snap  # what GET /clusters serves
        assert gc.health().ready and "3 clusters" in gc.health().detail
    finally:
        await gc.stop()
    await gc.stop()  # idempotent


async def test_labels_are_bounded_to_top_n_plus_other_and_unknown() -> None:
    gc = make(config(top_n_labels=2))
    await feed(gc, list(GOALS), 10)
    assert await gc.recluster() is True
    snap = gc.snapshot()
    assert len(snap["clusters"]) == 5
    named = [c["goal"] for c in snap["clusters"][:2]]
    assert named == [c["id"] for c in snap["clusters"][:2]]
    assert all(c["goal"] == OTHER for c in snap["clusters"][2:])
    sizes = {s.labels["goal"]: s.value for m in gc.metrics.cluster_size.collect() for s in m.samples}
    assert set(sizes) == {*named, OTHER} and sum(sizes.values()) == 50
    info = {s.labels["goal"]: s.labels["name"] for m in gc.metrics.goal_info.collect() for s in m.samples}
    assert info == {c["id"]: c["name"] for c in snap["clusters"][:2]}
    seen = set(await feed(gc, list(GOALS), 3, start=50))
    assert seen <= set(named) | {OTHER, UNKNOWN}
    assert OTHER in seen
    empty = await gc.goal_label(ctx("silent"))  # no user message at all
    assert empty == UNKNOWN


async def test_completion_rate_per_goal_with_outcomes_before_or_after_assignment() -> None:
    gc = make()
    await feed(gc, ["flight", "bank"], 12)
    await gc.recluster()
    gc.record_outcome("flight-100", True)  # verdict first
    await gc.goal_label(conv("flight", 100))
    await gc.goal_label(conv("flight", 101))
    gc.record_outcome("flight-101", False)  # verdict after
    gc.record_outcome("flight-101", False)  # repeated: counted once
    await gc.goal_label(conv("bank", 100))
    gc.record_outcome("bank-100", None)  # unknown verdict: not counted
    by_label = {c["label"] or "": c for c in gc.snapshot()["clusters"]}
    flight = next(c for lab, c in by_label.items() if "flight" in lab or "airline" in lab)
    assert (flight["complete"], flight["incomplete"], flight["completion_rate"]) == (1, 1, 0.5)
    bank = next(c for lab, c in by_label.items() if "bank" in lab or "account" in lab)
    assert bank["completion_rate"] is None
    gc.record_outcome("never-seen", True)  # harmless


async def test_outcomes_in_the_reservoir_carry_into_the_next_clustering() -> None:
    gc = make()
    await feed(gc, ["flight", "bank"], 12)
    for i in range(12):
        gc.record_outcome(f"flight-{i}", i % 3 == 0)
    await gc.recluster()
    flight = next(c for c in gc.snapshot()["clusters"] if c["size"] == 12 and c["complete"] + c["incomplete"])
    assert (flight["complete"], flight["incomplete"]) == (4, 8)


async def test_ids_are_stable_across_reclusterings_and_never_reused() -> None:
    gc = make()
    await feed(gc, ["flight", "restaurant", "car"], 10)
    await gc.recluster()
    first = {c["label"]: c["id"] for c in gc.snapshot()["clusters"]}
    await feed(gc, ["flight", "restaurant", "car"], 5, start=10)
    await gc.recluster()
    second = {c["label"]: c["id"] for c in gc.snapshot()["clusters"]}
    assert sorted(first.values()) == sorted(second.values())
    await feed(gc, ["weather"], 30)
    await gc.recluster()
    third = gc.snapshot()["clusters"]
    ids = [c["id"] for c in third]
    assert len(ids) == 4 and set(first.values()) < set(ids)
    new = (set(ids) - set(first.values())).pop()
    prefix = next(iter(first.values())).rsplit("g", 1)[0]
    assert new not in first.values() and new == f"{prefix}g4"
    other = make()
    await feed(other, ["flight", "restaurant", "car"], 10)
    await other.recluster()
    assert not {c["id"] for c in other.snapshot()["clusters"]} & set(ids)  # another process, other ids


async def test_drift_triggers_an_early_reclustering() -> None:
    gc = make(config(drift_ratio=1.5, drift_min_assignments=15, drift_ema_alpha=0.3, reservoir_size=1000))
    await feed(gc, ["flight", "restaurant"], 15)
    await gc.recluster("manual")
    await gc.start()
    try:
        await feed(gc, ["weather", "bank"], 15, start=200)  # far from every centroid
        for _ in range(200):
            if gc.snapshot()["runs"] >= 2:
                break
            await asyncio.sleep(0.05)
        snap = gc.snapshot()
        assert snap["runs"] >= 2 and snap["last_run"]["trigger"] == "drift"
    finally:
        await gc.stop()


class ThreadRecordingEmbedder(HashEmbedder):
    def __init__(self) -> None:
        super().__init__()
        self.threads: set[int] = set()

    def embed(self, texts: Sequence[str]) -> Matrix:
        self.threads.add(threading.get_ident())
        return super().embed(texts)


async def test_embedding_runs_off_the_event_loop_thread() -> None:
    emb = ThreadRecordingEmbedder()
    gc = make(embedder=emb)
    await feed(gc, ["flight", "car"], 12)
    await gc.recluster()
    assert emb.threads and threading.get_ident() not in emb.threads


class FailingEmbedder:
    def embed(self, texts: Sequence[str]) -> Matrix:
        raise RuntimeError("model exploded")


async def test_embedding_failure_costs_a_label_not_the_hook() -> None:
    gc = make(embedder=FailingEmbedder())
    assert await ended(gc, conv("car", 1)) == {"goal_id": None, "goal": UNKNOWN}
    assert gc.metrics.assignments.labels("error")._value.get() == 1


class OutageLLM(ExtractiveGoalLLM):
    down = False

    async def should_merge(self, query: MergeQuery) -> bool:
        if self.down:
            raise RetryableError("down")
        return await super().should_merge(query)


async def test_llm_outage_keeps_the_old_clusters() -> None:
    cfg = config()
    llm = OutageLLM(cfg)
    gc = make(cfg, llm=llm)
    await feed(gc, ["flight", "car"], 12)
    assert await gc.recluster()
    before = gc.snapshot()["clusters"]
    llm.down = True
    assert await gc.recluster("schedule") is False
    assert gc.snapshot()["clusters"] == before
    assert gc.metrics.runs.labels("schedule", "error")._value.get() == 1
    assert "RetryableError" in gc.health().detail and gc.health().ready


async def test_replayed_end_hook_and_hostile_input_stay_bounded() -> None:
    gc = make(config(reservoir_size=30, min_conversations=10))
    for _ in range(3):
        gc._pending.clear()  # as after a restart: the hook fires again for the same conversation
        await ended(gc, conv("car", 1))
    assert gc.snapshot()["reservoir_conversations"] == 1
    huge = ctx("huge", "x" * 1_000_000 + " \x00\u202e car rental")
    await ended(gc, huge)
    item = gc._reservoir.get("huge")
    assert item is not None and len(item.summary) <= gc._cfg.max_summary_chars
    await feed(gc, list(GOALS), 20)
    assert gc.snapshot()["reservoir_conversations"] == 30


async def test_not_enough_data_skips_and_disabled_does_nothing() -> None:
    gc = make()
    await feed(gc, ["car"], 3)
    assert await gc.recluster() is False
    off = make(config(enabled=False))
    await off.start()
    assert not off.scheduler.running and off.health().detail == "disabled"
    assert await off.goal_label(conv("car", 1)) == UNKNOWN
    assert off.on_conversation_ended(conv("car", 1)) == {}
    assert off.on_user_message(conv("car", 1)) == {} and off.on_turn_closed(conv("car", 1)) == {}
    assert len(off._reservoir) == 0
    await off.stop()


@pytest.mark.parametrize("n", [1, 5])
async def test_goal_label_and_end_hook_share_one_summary(n: int) -> None:
    class CountingEmbedder(HashEmbedder):
        pass

    emb = CountingEmbedder()
    gc = make(embedder=emb)
    c = conv("bank", 7)
    for _ in range(n):
        await asyncio.gather(gc.goal_label(c), ended(gc, c))
    assert emb.calls == 1
    assert np.isfinite(gc._reservoir.get("bank-7").vector).all()  # type: ignore[union-attr]


async def test_concurrent_endings_are_embedded_in_batches() -> None:
    emb = HashEmbedder(dim=512)
    gc = make(embedder=emb)
    labels = await asyncio.gather(*(gc.goal_label(conv(g, i)) for g in GOALS for i in range(20)))
    assert len(labels) == 100 and set(labels) == {UNKNOWN}
    assert len(gc._reservoir) == 100
    assert emb.calls <= 4  # 100 requests within one window: batches of at most 64


class WrongCountEmbedder:
    def embed(self, texts: Sequence[str]) -> Matrix:
        return np.zeros((len(texts) + 1, 4), dtype=np.float32)


async def test_an_embedder_returning_the_wrong_shape_costs_labels_only() -> None:
    gc = make(embedder=WrongCountEmbedder())
    out = await asyncio.gather(*(gc.goal_label(conv("car", i)) for i in range(5)))
    assert out == [UNKNOWN] * 5
    assert gc.metrics.assignments.labels("error")._value.get() == 5


class BrokenSummaryLLM(ExtractiveGoalLLM):
    async def summarize(self, transcript: Any) -> str:
        raise RetryableError("llm down")


async def test_summary_failure_falls_back_to_the_users_words() -> None:
    cfg = config()
    gc = make(cfg, llm=BrokenSummaryLLM(cfg))
    out = await ended(gc, conv("car", 3))
    assert out == {"goal_id": None, "goal": UNKNOWN}
    item = gc._reservoir.get("car-3")
    assert item is not None
    assert item.summary == extractive_summary(conv("car", 3).messages, cfg.max_summary_chars)


async def test_goal_ids_survive_a_renaming_recluster_and_names_follow() -> None:
    """A dashboard series is keyed by the goal id: a re-clustering that renames the goal (new
    members, new words) must keep the id, and the info metric carries the new name."""
    gc = make(config(top_n_labels=5))
    await feed(gc, ["flight", "bank"], 12)
    assert await gc.recluster()
    before = {c["id"]: c["name"] for c in gc.snapshot()["clusters"]}
    await feed(gc, ["flight", "bank"], 12, start=12)
    assert await gc.recluster()
    after = {c["id"]: c["name"] for c in gc.snapshot()["clusters"]}
    assert set(after) == set(before)
    info = {s.labels["goal"]: s.labels["name"] for m in gc.metrics.goal_info.collect() for s in m.samples}
    assert info == after


async def test_small_clusters_are_never_named_after_one_conversation() -> None:
    """One user who typed a name and a number alone in a cluster: the cluster stays unnamed, on
    metrics and on /clusters, however the label was written."""
    gc = make(config(min_conversations=10, keyword_min_document_frequency=2, min_conversations_per_name=3))
    await feed(gc, ["flight", "bank"], 10)
    lone = TurnContext(
        "conversation_ended",
        "lone",
        1,
        (Message("user", "zebediah kowalczyk 5551234 quetzal xylophone"),),
        None,
        None,
    )
    await gc.goal_label(lone)
    assert await gc.recluster()
    snap = gc.snapshot()
    text = json.dumps(snap) + repr([s for m in gc.metrics.goal_info.collect() for s in m.samples])
    for word in ("zebediah", "kowalczyk", "5551234", "quetzal"):
        assert word not in text
    small = [c for c in snap["clusters"] if c["size"] < 3]
    assert small  # the lone conversation got a cluster of its own: the case this test is about
    assert all(c["name"] == "unnamed" and c["label"] is None for c in small)
