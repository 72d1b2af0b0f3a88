"""Wiring only: build the components from the config and supervise them in one TaskGroup."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import signal
import sys

import structlog
from prometheus_client import CollectorRegistry

from sidecar.config import SidecarConfig
from sidecar.lifecycle import HealthReporter
from sidecar.source.kafka import KafkaEventSource
from sidecar.state.hooks import ConversationHooks, RecordingHooks
from sidecar.telemetry.http import HttpServer
from sidecar.telemetry.logging import configure_logging
from sidecar.telemetry.stream_metrics import StreamMetrics

log = structlog.get_logger(__name__)


# The sidecar holds hundreds of thousands of long-lived container objects (open conversations and
# their messages). With CPython's default gen-0 threshold of 700 allocations, the collector runs
# every few records and each older-generation pass walks that whole heap: measured at 2.5x the
# processing cost per record (tests/bench/bench_stream.py). A larger threshold keeps collections
# rare; ``gc.freeze()`` moves everything allocated at start-up out of the collector's sight.
GC_THRESHOLDS = (50_000, 20, 100)


def tune_gc() -> None:
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


def build_hooks(config: SidecarConfig, registry: CollectorRegistry) -> ConversationHooks:
    """The hook set the config asks for; the no-op recorder when no scorer is enabled."""
    del config, registry  # scorers and goal clustering plug in here
    return RecordingHooks()


async def run_app(
    config: SidecarConfig,
    *,
    hooks: ConversationHooks | None = None,
    ready: asyncio.Event | None = None,
    stop: asyncio.Event | None = None,
    registry: CollectorRegistry | None = None,
) -> None:
    """Run the sidecar until ``stop`` is set (or the task is cancelled), then shut down cleanly."""
    registry = registry or CollectorRegistry()
    metrics = StreamMetrics(registry)
    hooks = hooks if hooks is not None else build_hooks(config, registry)
    source = KafkaEventSource(config.kafka, config.state, hooks, metrics)
    health: list[HealthReporter] = [source]
    http = HttpServer(config.http, registry, health)
    stop = stop or asyncio.Event()
    tune_gc()
    try:
        await http.start()
        await source.start()
        log.info("sidecar.started", topic=config.kafka.topic, group=config.kafka.group_id, http_port=http.port)
        if ready is not None:
            ready.set()
        async with asyncio.TaskGroup() as tg:
            runner = tg.create_task(source.run(), name="kafka-source")
            await stop.wait()
            runner.cancel()
    finally:
        await source.stop()
        await http.stop()
        log.info("sidecar.stopped")


def run_forever(config: SidecarConfig) -> int:
    """``sidecar run``: run until SIGTERM/SIGINT."""
    configure_logging(config.logging, sys.stderr)

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError):
                loop.add_signal_handler(sig, stop.set)
        await run_app(config, stop=stop)

    asyncio.run(main())
    return 0
