"""The supervisor: what counts as a death, what /readyz says, fatal tasks, leftovers."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from structlog.testing import capture_logs

from sidecar.clustering.embed import EmbedBatcher, Matrix
from sidecar.supervision import TASKS_CHECK, Supervisor, spawn


async def _forever() -> None:
    await asyncio.Event().wait()


async def _boom() -> None:
    await asyncio.sleep(0)
    raise RuntimeError("boom")


async def _quick() -> None:
    await asyncio.sleep(0)


async def test_a_task_that_raises_fails_health_with_its_name() -> None:
    supervisor = Supervisor()
    async with supervisor.running():
        with capture_logs() as logs:
            ok = spawn("steady", _forever)
            dead = spawn("probe", _boom)
            await asyncio.wait({dead.task})
        health = supervisor.health()
        assert (health.name, health.ready) == (TASKS_CHECK, False)
        assert health.detail == "probe raised RuntimeError"
        assert isinstance(dead.error, RuntimeError)
        assert [e["task"] for e in logs if e["event"] == "task.died"] == ["probe"]
        await ok.stop()


async def test_returning_is_a_death_only_for_loops_meant_to_run_until_cancelled() -> None:
    supervisor = Supervisor()
    async with supervisor.running():
        once = spawn("one-shot", _quick, until_cancelled=False)
        loop = spawn("loop", _quick)
        await asyncio.wait({once.task, loop.task})
        assert once.death is None
        assert loop.death == "returned"
        assert supervisor.health().detail == "loop returned"


async def test_cancellation_is_not_a_death_and_the_callers_own_propagates() -> None:
    supervisor = Supervisor()
    async with supervisor.running():
        task = spawn("loop", _forever)
        await asyncio.sleep(0)
        assert supervisor.health().detail == "1 running: loop"
        await task.stop()
        assert task.death is None
        assert supervisor.health().ready

        stopper = asyncio.create_task(spawn("stubborn", _forever).stop())
        await asyncio.sleep(0)
        stopper.cancel()
        with pytest.raises(asyncio.CancelledError):
            await stopper


async def test_a_fatal_task_stops_the_app_and_is_raised_after_the_shutdown() -> None:
    stop = asyncio.Event()
    supervisor = Supervisor(on_fatal=stop.set)
    shut_down = False

    async def app() -> None:
        nonlocal shut_down
        async with supervisor.running():
            supervisor.spawn("kafka-source", _boom, fatal=True)
            await stop.wait()
            shut_down = True

    with pytest.raises(RuntimeError, match="boom"):
        await app()
    assert shut_down


async def test_tasks_left_running_are_cancelled_when_the_supervisor_closes() -> None:
    supervisor = Supervisor()
    with capture_logs() as logs:
        async with supervisor.running():
            left = spawn("forgotten", _forever)
            await asyncio.sleep(0)
    assert left.task.cancelled()
    assert [e["task"] for e in logs if e["event"] == "task.left_running"] == ["forgotten"]


async def test_without_a_supervisor_spawn_gives_the_component_a_named_task() -> None:
    task = spawn("alone", _boom)
    assert task.task.get_name() == "alone"
    await asyncio.wait({task.task})
    assert task.death == "raised RuntimeError"
    await task.stop()  # idempotent on an ended task


class _SlowEmbedder:
    def embed(self, texts: list[str]) -> Matrix:
        return np.zeros((len(texts), 4), dtype=np.float32)


async def test_the_embed_batcher_stop_cancels_queued_requests() -> None:
    batcher = EmbedBatcher(_SlowEmbedder(), window_seconds=60.0)
    waiting = asyncio.create_task(batcher.embed_one("hello"))
    await asyncio.sleep(0.01)
    await batcher.stop()
    await asyncio.wait({waiting})
    assert waiting.cancelled()
    await batcher.stop()
