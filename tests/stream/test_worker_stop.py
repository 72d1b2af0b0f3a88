"""A partition worker ends when it is cancelled, even when a batch arrives at the same moment.

On Python 3.11, ``asyncio.wait_for`` returns the inner result and drops the cancellation when both
happen in the same loop iteration; a worker waiting on its queue that way kept running after the
source's stop, and the source's TaskGroup (and with it the whole shutdown) waited forever. The
worker here is the real one; only recovery and the processor are stand-ins (no broker is used).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiokafka import TopicPartition
from prometheus_client import CollectorRegistry

from sidecar.source import worker as worker_module
from sidecar.source.config import KafkaConfig
from sidecar.source.journal import Recovery
from sidecar.source.kafka import KafkaEventSource
from sidecar.source.worker import Batch, PartitionWorker, UnreadableRecord
from sidecar.stage.pipeline import PostScoreStage
from sidecar.state.config import StateConfig
from sidecar.state.hooks import RecordingHooks
from sidecar.telemetry.stream_metrics import StreamMetrics


class _Processor:
    """What the worker's loop calls on its processor; counts the batches' records."""

    def __init__(self, **_: Any) -> None:
        self.processed = 0

    async def process_unreadable(self, *_: Any) -> None:
        self.processed += 1

    async def tick(self) -> None:
        return None


@pytest.fixture
async def worker(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[PartitionWorker]:
    cfg = KafkaConfig(bootstrap_servers="127.0.0.1:1", topic="conversations")
    source = KafkaEventSource(
        cfg, StateConfig(), RecordingHooks(), StreamMetrics(CollectorRegistry()), PostScoreStage([])
    )

    async def recovery(*_: Any) -> Recovery:
        return Recovery(start_offset=0, replay_until=0, journal_from=0, journal_end=0)

    async def partition_count() -> int:
        return 1

    monkeypatch.setattr(worker_module, "load_recovery", recovery)
    monkeypatch.setattr(worker_module, "PartitionProcessor", _Processor)
    monkeypatch.setattr(source.results, "partition_count", partition_count)
    yield PartitionWorker(TopicPartition("conversations", 0), source._services)
    await source.stop()


async def _until_waiting(w: PartitionWorker) -> None:
    for _ in range(100):
        if w.processor is not None:
            break
        await asyncio.sleep(0)
    await asyncio.sleep(0.01)  # the loop is now waiting on its empty queue


async def test_a_cancel_that_coincides_with_a_batch_stops_the_worker(worker: PartitionWorker) -> None:
    task = asyncio.create_task(worker.run())
    await _until_waiting(worker)
    assert worker.processor is not None and not task.done()
    # The batch wakes the worker's queue wait, and the cancel lands in the same loop iteration.
    assert worker.offer(Batch([UnreadableRecord("conversations", 0, 0, "test")], 0.0, 0.0, 1))
    task.cancel()
    done, _ = await asyncio.wait({task}, timeout=2)
    assert task in done, "the worker kept running after its cancellation"
    assert task.cancelled()


async def test_a_cancel_while_idle_stops_the_worker(worker: PartitionWorker) -> None:
    task = asyncio.create_task(worker.run())
    await _until_waiting(worker)
    task.cancel()
    done, _ = await asyncio.wait({task}, timeout=2)
    assert task in done and task.cancelled()
