"""The re-clustering scheduler: triggers (initial, schedule, drift), runs, failures, its task."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from structlog.testing import capture_logs

from sidecar.clustering.algorithm import ClusteringResult
from sidecar.clustering.completion_rate import CompletionRates
from sidecar.clustering.config import ClusteringConfig
from sidecar.clustering.ids import ClusterIdRegistry
from sidecar.clustering.llm import MergeQuery
from sidecar.clustering.metrics import ClusteringMetrics
from sidecar.clustering.model import GoalModel
from sidecar.clustering.records import Published
from sidecar.clustering.reservoir import Reservoir, ReservoirItem
from sidecar.clustering.scheduler import TASK_NAME, ReclusterScheduler
from sidecar.errors import RetryableError
from tests.clustering.fakes import HashEmbedder, OracleLLM, blobs


class Parts:
    """A scheduler with the real model, rates and reservoir it drives."""

    def __init__(
        self,
        llm: OracleLLM | None = None,
        publish: Callable[[ClusteringResult], Awaitable[Published]] | None = None,
        **cfg: Any,
    ) -> None:
        base: dict[str, Any] = {"enabled": True, "k1": 6, "min_conversations": 12, "reservoir_size": 200}
        self.cfg = ClusteringConfig(**{**base, **cfg})
        self.metrics = ClusteringMetrics(CollectorRegistry())
        self.model = GoalModel(self.cfg, ClusterIdRegistry(prefix="t-g"))
        self.reservoir = Reservoir(self.cfg.reservoir_size)
        self.completion = CompletionRates(100, self.reservoir)
        self.llm = llm or OracleLLM()
        self.scheduler = ReclusterScheduler(
            self.cfg,
            self.metrics,
            model=self.model,
            completion=self.completion,
            reservoir=self.reservoir,
            llm=self.llm,
            embedder=HashEmbedder(),
            publish=publish,
        )
        self.texts, self.vectors, self.truth = blobs(3, 30, seed=1)
        self.offered = 0

    def offer(self, n: int) -> None:
        for i in range(self.offered, self.offered + n):
            row = (i % 3) * 30 + i // 3  # the three goals in turn
            self.scheduler.offer(ReservoirItem(f"c{i}", self.texts[row], self.vectors[row]))
        self.offered += n

    def runs(self, trigger: str, result: str) -> float:
        value: float = self.metrics.runs.labels(trigger, result)._value.get()
        return value


async def eventually(check: Callable[[], bool]) -> None:
    for _ in range(200):
        if check():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("condition not reached")


async def test_too_small_a_sample_is_skipped() -> None:
    p = Parts()
    p.offer(11)
    assert await p.scheduler.recluster() is False
    assert p.runs("manual", "skipped") == 1 and len(p.model) == 0 and p.scheduler.runs == 0


async def test_a_run_replaces_the_model_and_restarts_the_rates_from_the_sample() -> None:
    p = Parts()
    p.offer(24)
    p.completion.record_outcome("c0", True)
    p.completion.record_outcome("c3", False)
    assert await p.scheduler.recluster() is True
    assert len(p.model) == 3 and p.scheduler.runs == 1 and p.runs("manual", "ok") == 1
    assert p.scheduler.last_run["trigger"] == "manual" and p.scheduler.last_run["conversations"] == 24
    assert p.scheduler.last_run["clusters"] == 3
    counts = {c.id: p.completion.counts(c.id) for c in p.model.clusters()}
    assert sorted(counts.values()) == [(0, 0), (0, 0), (1, 1)]  # c0 and c3 are of one goal
    assert p.metrics.clusters._value.get() == 3  # the model is published


async def test_each_run_halves_the_weight_of_the_past_in_the_reservoir() -> None:
    p = Parts(reservoir_size=20)
    p.offer(60)
    assert len(p.reservoir) == 20 and p.reservoir.seen == 60
    assert await p.scheduler.recluster()
    assert p.reservoir.seen == 30


async def test_a_failed_run_keeps_the_old_model_and_says_why() -> None:
    down = False

    def decide(query: MergeQuery) -> bool:
        if down:
            raise RetryableError("llm down")
        return False

    p = Parts(OracleLLM(decide))
    p.offer(24)
    assert await p.scheduler.recluster()
    before = [c.id for c in p.model.clusters()]
    down = True
    p.offer(6)
    assert await p.scheduler.recluster("schedule") is False
    assert [c.id for c in p.model.clusters()] == before
    assert p.scheduler.last_error == "RetryableError" and p.runs("schedule", "error") == 1
    down = False
    assert await p.scheduler.recluster()
    assert p.scheduler.last_error == ""


@pytest.mark.parametrize(("published", "result"), [("not_leader", "not_leader"), ("publish_error", "error")])
async def test_a_leader_that_steps_down_mid_run_is_not_counted_as_a_failure(published: Published, result: str) -> None:
    """A run whose model the fleet refused because this replica no longer leads is a correct
    step-down (counted not_leader, logged at info); an unacknowledged write stays an error."""

    async def publish(res: ClusteringResult) -> Published:
        return published

    p = Parts(publish=publish)
    p.offer(24)
    with capture_logs() as logs:
        assert await p.scheduler.recluster("schedule") is False
    assert p.runs("schedule", result) == 1
    assert p.runs("schedule", "error" if result == "not_leader" else "not_leader") == 0
    assert p.runs("schedule", "ok") == 0 and p.scheduler.runs == 0
    events = {(e["event"], e["log_level"]) for e in logs}
    if result == "not_leader":
        assert ("clustering.stepped_down", "info") in events
        assert not any(name == "clustering.run_failed" for name, _ in events)
        assert p.scheduler.last_error == ""
    else:
        assert ("clustering.run_failed", "warning") in events
        assert p.scheduler.last_error == "ModelNotPublished"


async def test_the_first_run_starts_as_soon_as_the_sample_is_big_enough() -> None:
    p = Parts()
    await p.scheduler.start()
    try:
        p.offer(11)
        await asyncio.sleep(0.1)
        assert p.scheduler.runs == 0
        p.offer(1)
        await eventually(lambda: p.scheduler.runs == 1)
        assert p.scheduler.last_run["trigger"] == "initial"
    finally:
        await p.scheduler.stop()


async def test_the_schedule_skips_periods_with_nothing_new() -> None:
    p = Parts(recluster_interval_seconds=0.05)
    p.offer(24)
    assert await p.scheduler.recluster()
    await p.scheduler.start()
    try:
        await eventually(lambda: p.runs("schedule", "skipped") >= 2)
        assert p.scheduler.runs == 1
        p.offer(3)
        await eventually(lambda: p.scheduler.runs == 2)
        assert p.scheduler.last_run["trigger"] == "schedule"
    finally:
        await p.scheduler.stop()


def record_triggers(p: Parts, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Replace the run by a recorder: what the loop asks for, as soon as it asks."""
    triggers: list[str] = []

    async def recluster(trigger: str = "manual") -> bool:
        triggers.append(trigger)
        return True

    monkeypatch.setattr(p.scheduler, "recluster", recluster)
    return triggers


async def test_drift_wakes_the_loop_only_past_the_ratio_after_enough_assignments(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    p = Parts(drift_ratio=2.0, drift_min_assignments=5, drift_ema_alpha=0.5)
    p.offer(24)
    assert await p.scheduler.recluster()  # a real run sets the baseline distance
    triggers = record_triggers(p, monkeypatch)
    await p.scheduler.start()
    try:
        far = 10.0  # far beyond 2 x any baseline between unit vectors
        for _ in range(4):
            p.scheduler.observe_distance(far)
        await asyncio.sleep(0.05)
        assert triggers == []  # not trusted before drift_min_assignments
        gauge: float = p.metrics.assignment_distance._value.get()
        assert gauge == pytest.approx(far)
        p.scheduler.observe_distance(far)
        await eventually(lambda: triggers == ["drift"])
    finally:
        await p.scheduler.stop()


async def test_assignments_close_to_their_centroids_are_no_drift(monkeypatch: pytest.MonkeyPatch) -> None:
    p = Parts(drift_ratio=2.0, drift_min_assignments=5, drift_ema_alpha=0.5)
    p.offer(24)
    assert await p.scheduler.recluster()
    triggers = record_triggers(p, monkeypatch)
    await p.scheduler.start()
    try:
        for _ in range(50):
            p.scheduler.observe_distance(0.01)
        await asyncio.sleep(0.05)
        assert triggers == []
    finally:
        await p.scheduler.stop()


async def test_a_drift_run_is_labelled_drift_and_resets_the_drift_check(monkeypatch: pytest.MonkeyPatch) -> None:
    p = Parts(drift_ratio=2.0, drift_min_assignments=5, drift_ema_alpha=0.5)
    p.offer(24)
    assert await p.scheduler.recluster()
    await p.scheduler.start()
    try:
        for _ in range(5):
            p.scheduler.observe_distance(10.0)
        await eventually(lambda: p.scheduler.runs == 2)
        assert p.scheduler.last_run["trigger"] == "drift" and p.runs("drift", "ok") == 1
        triggers = record_triggers(p, monkeypatch)
        for _ in range(4):  # the count of assignments restarted with the run
            p.scheduler.observe_distance(10.0)
        await asyncio.sleep(0.05)
        assert triggers == []
    finally:
        await p.scheduler.stop()


async def test_the_loop_is_one_named_task_and_stopping_is_idempotent() -> None:
    p = Parts()
    await p.scheduler.stop()  # before start
    await p.scheduler.start()
    await p.scheduler.start()  # once
    names = [t.get_name() for t in asyncio.all_tasks()]
    assert names.count(TASK_NAME) == 1 and p.scheduler.running and not p.scheduler.crashed
    await p.scheduler.stop()
    await p.scheduler.stop()
    assert not p.scheduler.running
    assert TASK_NAME not in [t.get_name() for t in asyncio.all_tasks() if not t.done()]


async def test_a_dead_loop_is_reported_as_crashed(monkeypatch: pytest.MonkeyPatch) -> None:
    p = Parts(recluster_interval_seconds=0.01)
    p.offer(1)

    async def explode(trigger: str = "manual") -> bool:
        raise RuntimeError(trigger)

    monkeypatch.setattr(p.scheduler, "recluster", explode)
    await p.scheduler.start()
    try:
        await eventually(lambda: p.scheduler.crashed)
    finally:
        await p.scheduler.stop()
