"""The loop-lag probe sees work that holds the event loop."""

from __future__ import annotations

import asyncio
import time

import pytest
from prometheus_client import CollectorRegistry

from sidecar.telemetry.loop_lag import LoopLagMonitor


async def test_a_blocked_loop_shows_as_lag() -> None:
    registry = CollectorRegistry()
    monitor = LoopLagMonitor(registry, interval=0.05)
    task = asyncio.create_task(monitor.run())
    calm = None
    for _ in range(100):  # bounded: on a loaded machine the first probes may come late
        await asyncio.sleep(0.05)
        calm = registry.get_sample_value("sidecar_event_loop_lag_seconds_bucket", {"le": "0.25"})
        if calm:
            break
    assert calm is not None and calm >= 1
    time.sleep(0.6)  # noqa: ASYNC251 - on purpose: work holding the loop, as a long tokenisation used to
    await asyncio.sleep(0.2)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    count = registry.get_sample_value("sidecar_event_loop_lag_seconds_count")
    late = registry.get_sample_value("sidecar_event_loop_lag_seconds_bucket", {"le": "0.25"})
    assert count is not None and late is not None
    assert count - late >= 1  # one probe ran at least 0.25 s late
    total = registry.get_sample_value("sidecar_event_loop_lag_seconds_sum", {})
    assert total is not None and total >= 0.5


def test_interval_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        LoopLagMonitor(CollectorRegistry(), interval=0)
