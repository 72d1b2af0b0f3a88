"""Event-loop lag: how late the loop runs a callback scheduled for a known time.

Every partition, the Kafka heartbeat and the HTTP server share one event loop; anything that holds
it (CPU work that belongs on a thread, a blocking call) shows here before it shows as a missed
heartbeat and a rebalance. ``sidecar_event_loop_lag_seconds`` is a histogram of the lateness of a
probe that wakes every ``interval`` seconds.
"""

from __future__ import annotations

import asyncio
import time

from prometheus_client import CollectorRegistry, Histogram

LAG_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class LoopLagMonitor:
    """Samples the loop's lateness; run :meth:`run` as a supervised task."""

    def __init__(self, registry: CollectorRegistry, interval: float = 0.25) -> None:
        if interval <= 0:
            raise ValueError("interval must be positive")
        self.interval = interval
        self.lag = Histogram(
            "sidecar_event_loop_lag_seconds",
            "How late the event loop ran a probe scheduled every 0.25 s (work holding the loop)",
            buckets=LAG_BUCKETS,
            registry=registry,
        )

    async def run(self) -> None:
        while True:
            due = time.monotonic() + self.interval
            await asyncio.sleep(self.interval)
            self.lag.observe(max(0.0, time.monotonic() - due))
