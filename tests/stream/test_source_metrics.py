"""The Kafka source's per-partition gauges, read from the real registry's exposition.

The source is built but never started (no broker is contacted): the consumer's ``highwater`` and
``commit`` are replaced, and each partition's processor is a stand-in that exposes what the
commit loop reads. What is checked is what Prometheus would scrape.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiokafka import TopicPartition
from aiokafka.errors import KafkaConnectionError
from aiokafka.structs import OffsetAndMetadata
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from sidecar.source.config import KafkaConfig
from sidecar.source.journal import CommitPoint
from sidecar.source.kafka import KafkaEventSource
from sidecar.source.worker import PartitionWorker
from sidecar.stage.pipeline import PostScoreStage
from sidecar.state.config import StateConfig
from sidecar.state.hooks import RecordingHooks
from sidecar.telemetry.stream_metrics import StreamMetrics

TOPIC = "conversations"
PER_PARTITION = (
    "sidecar_consumer_lag_records", "sidecar_commit_age_seconds", "sidecar_oldest_conversation_age_seconds",
)  # fmt: skip


@dataclass
class _Conversation:
    opened_at_unix: float


@dataclass
class _State:
    open: list[_Conversation] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.open)

    def oldest(self) -> _Conversation | None:
        return min(self.open, key=lambda c: c.opened_at_unix, default=None)


@dataclass
class FakeProcessor:
    """What KafkaEventSource reads from a PartitionProcessor in its commit loop and on revoke."""

    next_offset: int
    pinned_at: int | None = None  # an open conversation holds the commit point here
    state: _State = field(default_factory=_State)
    pending_effects: int = 0
    replaying: bool = False

    def oldest_pending_age(self, _now: float) -> float:
        return 0.0

    def commit_point(self) -> CommitPoint:
        offset = self.next_offset if self.pinned_at is None else self.pinned_at
        return CommitPoint(offset=offset, processed_until=self.next_offset, journal_from=0)

    async def release(self, _grace: float, _flush: float) -> CommitPoint:
        return self.commit_point()


@dataclass
class Harness:
    source: KafkaEventSource
    registry: CollectorRegistry
    highwater: dict[int, int]
    commit_fails: bool = False
    committed: list[dict[TopicPartition, OffsetAndMetadata]] = field(default_factory=list)

    def own(self, partition: int, processor: FakeProcessor) -> PartitionWorker:
        tp = TopicPartition(TOPIC, partition)
        self.source.assign([tp])
        w = self.source._workers[tp]
        w.processor = processor  # type: ignore[assignment]
        return w

    def wait(self, seconds: float) -> None:
        """Let ``seconds`` pass for the commit clocks (moved back rather than slept through)."""
        for w in self.source._workers.values():
            w.uncommitted_since -= seconds

    def samples(self, name: str) -> dict[str, float]:
        """partition -> value of family ``name`` in the exposition text."""
        text = generate_latest(self.registry).decode()
        for family in text_string_to_metric_families(text):
            if family.name == name:
                return {s.labels["partition"]: s.value for s in family.samples}
        return {}


@pytest.fixture
async def harness(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Harness]:
    registry = CollectorRegistry()
    cfg = KafkaConfig(bootstrap_servers="127.0.0.1:1", topic=TOPIC)
    source = KafkaEventSource(cfg, StateConfig(), RecordingHooks(), StreamMetrics(registry), PostScoreStage([]))
    h = Harness(source, registry, {})

    async def commit(offsets: dict[TopicPartition, OffsetAndMetadata]) -> None:
        if h.commit_fails:
            raise KafkaConnectionError()
        h.committed.append(dict(offsets))

    def highwater(tp: TopicPartition) -> int | None:
        return h.highwater.get(tp.partition)

    monkeypatch.setattr(source.consumer, "commit", commit)
    monkeypatch.setattr(source.consumer, "highwater", highwater)
    yield h
    await source.stop()


async def test_lag_is_high_water_mark_minus_next_offset(harness: Harness) -> None:
    harness.own(0, FakeProcessor(next_offset=40))
    harness.highwater[0] = 100
    await harness.source.commit_now()
    assert harness.samples("sidecar_consumer_lag_records") == {"0": 60.0}


async def test_revoked_partition_leaves_no_series_behind(harness: Harness) -> None:
    harness.own(0, FakeProcessor(next_offset=40))
    harness.own(1, FakeProcessor(next_offset=7, pinned_at=5, state=_State([_Conversation(1.0)])))
    harness.highwater.update({0: 100, 1: 10})
    await harness.source.commit_now()
    for name in PER_PARTITION:
        assert set(harness.samples(name)) == {"0", "1"}, name

    await harness.source.revoke([TopicPartition(TOPIC, 1)])

    for name in PER_PARTITION:
        assert set(harness.samples(name)) == {"0"}, name
    # and the next round of the commit loop does not bring them back
    await harness.source.commit_now()
    for name in PER_PARTITION:
        assert set(harness.samples(name)) == {"0"}, name


async def test_failed_commits_do_not_reset_the_commit_age(harness: Harness) -> None:
    p = FakeProcessor(next_offset=10)
    harness.own(0, p)
    await harness.source.commit_now()  # offset 10 accepted
    assert harness.samples("sidecar_commit_age_seconds")["0"] == pytest.approx(0, abs=5)

    harness.commit_fails = True
    for _ in range(5):
        harness.wait(60)
        p.next_offset += 5
        await harness.source.commit_now()
    # Records have waited past offset 10 for five minutes, whatever the failed attempts did.
    assert harness.samples("sidecar_commit_age_seconds")["0"] == pytest.approx(300, abs=5)
    assert harness.registry.get_sample_value("sidecar_commits_total", {"result": "failed"}) == 5

    harness.commit_fails = False
    harness.wait(60)
    p.next_offset += 5
    await harness.source.commit_now()  # the commit moves the offset: the clock restarts
    assert harness.samples("sidecar_commit_age_seconds")["0"] == pytest.approx(0, abs=5)
    assert harness.committed[-1][TopicPartition(TOPIC, 0)].offset == 40


async def test_commit_age_is_per_partition(harness: Harness) -> None:
    """An old open conversation on one partition must not hide a stuck commit on another."""
    old = FakeProcessor(next_offset=50, pinned_at=5, state=_State([_Conversation(opened_at_unix=0.0)]))
    stuck = FakeProcessor(next_offset=20)
    harness.own(0, old)
    harness.own(1, stuck)
    await harness.source.commit_now()
    harness.commit_fails = True  # partition 1 keeps getting records; its commits fail
    harness.wait(600)
    stuck.next_offset += 100
    await harness.source.commit_now()
    age = harness.samples("sidecar_commit_age_seconds")
    conversations = harness.samples("sidecar_oldest_conversation_age_seconds")
    assert age == {"0": pytest.approx(600, abs=5), "1": pytest.approx(600, abs=5)}
    assert conversations["0"] > 600 and conversations["1"] == 0.0
    # what SidecarCommitStalled computes: only partition 1 is unexplained
    assert [p for p in age if age[p] - conversations[p] > 300] == ["1"]


async def test_commit_counters_exist_before_the_first_commit(harness: Harness) -> None:
    values: dict[str, Any] = {
        r: harness.registry.get_sample_value("sidecar_commits_total", {"result": r}) for r in ("ok", "failed")
    }
    assert values == {"ok": 0.0, "failed": 0.0}


async def test_a_commit_that_never_answers_does_not_hold_the_revoke(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """aiokafka retries a retriable commit error without end; a revoke (which holds the whole
    rebalance) gives its final commit ``revoke_flush_timeout_seconds`` and then goes on."""
    import asyncio
    import time

    from sidecar.source.kafka import KafkaEventSource

    cfg = harness.source.cfg.model_copy(update={"revoke_flush_timeout_seconds": 0.3})
    monkeypatch.setattr(harness.source, "cfg", cfg)

    async def never(offsets: dict[TopicPartition, OffsetAndMetadata]) -> None:
        await asyncio.Event().wait()

    monkeypatch.setattr(harness.source.consumer, "commit", never)
    harness.own(0, FakeProcessor(next_offset=40))
    began = time.monotonic()
    await asyncio.wait_for(harness.source.revoke([TopicPartition(TOPIC, 0)]), 5)
    assert time.monotonic() - began < 3
    assert harness.registry.get_sample_value("sidecar_commits_total", {"result": "failed"}) == 1
    assert isinstance(harness.source, KafkaEventSource)


async def test_an_assignment_after_the_source_stopped_running_creates_no_task(harness: Harness) -> None:
    """The consumer still answers the group while the app shuts down: an assignment that arrives
    after run() ended must not create tasks in its finished TaskGroup."""
    import asyncio

    run = asyncio.create_task(harness.source.run())
    await asyncio.sleep(0.05)
    run.cancel()
    await asyncio.gather(run, return_exceptions=True)
    harness.source.assign([TopicPartition(TOPIC, 3)])  # raised RuntimeError before
    assert harness.source._workers[TopicPartition(TOPIC, 3)].task is None
