"""Event-loop lag while the OTLP receiver processes one large request (40,000 chat spans).

One OTLP/HTTP request of ``--spans`` chat spans (each its own conversation, a user message and a
reply; about 370 KB of gzip) is turned into events twice in the same run, while a probe on the same
event loop wakes every 5 ms and records how late it ran:

* **before**: gunzip, decode and derive called on the event loop, as the receiver did before its
  work moved to a worker thread;
* **idle**: nothing to do for 5 s, the floor this machine's load sets;
* **after**: the same bytes POSTed to a running :class:`~sidecar.otel.receiver.OtlpHttpReceiver`
  (limits raised to admit the request), which decodes in slices and derives in a worker thread.

Kafka is replaced by an in-memory producer (its cost is not the point). The report is the worst and
99th-percentile lag of each phase and their ratio; the goal is a worst lag under 100 ms.

Run: ``.venv/bin/python -m tests.bench.bench_otlp_loop_lag [--spans 40000] [--skip-before]``
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import os
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import httpx
from prometheus_client import CollectorRegistry

from sidecar.otel.config import OtelConfig, OtlpReceiverConfig
from sidecar.otel.decode import decode_traces, gunzip
from sidecar.otel.ingest import OtelIngest
from sidecar.otel.metrics import OtelMetrics
from sidecar.otel.receiver import OtlpHttpReceiver
from tests.otel.spans import chat_attrs, make_span, traces

TICK_SECONDS = 0.005
LIMIT = 64 * 1_048_576


class MemoryProducer:
    def __init__(self) -> None:
        self.records = 0

    async def produce(
        self, topic: str, records: Sequence[tuple[bytes, bytes | None]], *, timeout_seconds: float, headers: Any = None
    ) -> None:
        self.records += len(records)


def build(spans: int) -> bytes:
    history = [{"role": "user", "content": "Is my order on its way?"}, {"role": "assistant", "content": "Yes."}]
    data = traces(make_span(chat_attrs("genai", history, f"bench-{i}")) for i in range(spans))
    return gzip.compress(data.SerializeToString())


async def lag_while(work: Callable[[], Awaitable[int]]) -> tuple[list[float], int, float]:
    """Lateness of every 5 ms tick while ``work`` runs, its result and its wall time."""
    lags: list[float] = []
    running = True

    async def tick() -> None:
        while running:
            due = time.monotonic() + TICK_SECONDS
            await asyncio.sleep(TICK_SECONDS)
            lags.append(max(0.0, time.monotonic() - due))

    ticker = asyncio.ensure_future(tick())
    await asyncio.sleep(0.05)
    start = time.monotonic()
    try:
        result = await work()
    finally:
        elapsed = time.monotonic() - start
        running = False
        await ticker
    return lags, result, elapsed


def _ingest() -> tuple[OtelIngest, OtelMetrics]:
    metrics = OtelMetrics(CollectorRegistry())
    return OtelIngest(OtelConfig(), metrics, max_event_bytes=1 << 20), metrics


async def idle(_body: bytes) -> tuple[list[float], int, float]:
    """The floor: the same probe with nothing to do for 5 s (what the machine's load alone costs)."""

    async def work() -> int:
        await asyncio.sleep(5)
        return 0

    return await lag_while(work)


async def before(body: bytes) -> tuple[list[float], int, float]:
    ingest, _ = _ingest()

    async def work() -> int:
        data = decode_traces(gunzip(body, max_bytes=LIMIT), "otlp_proto", max_bytes=LIMIT)
        return len(ingest.derive(data, "receiver").records)

    return await lag_while(work)


async def after(body: bytes) -> tuple[list[float], int, float]:
    ingest, metrics = _ingest()
    producer = MemoryProducer()
    cfg = OtlpReceiverConfig(
        enabled=True,
        host="127.0.0.1",
        port=0,
        allow_unauthenticated=True,
        max_body_bytes=LIMIT,
        max_decompressed_bytes=LIMIT,
        max_spans_per_request=1_000_000,
        max_work_seconds=300,
    )
    receiver = OtlpHttpReceiver(cfg, ingest, producer, metrics, events_topic="events")  # type: ignore[arg-type]
    await receiver.start()
    try:
        # The client is made before the measured window (it reads CA certificates, on the loop).
        async with httpx.AsyncClient(timeout=600) as client:

            async def work() -> int:
                answer = await client.post(
                    f"http://127.0.0.1:{receiver.port}/v1/traces",
                    content=body,
                    headers={"Content-Type": "application/x-protobuf", "Content-Encoding": "gzip"},
                )
                answer.raise_for_status()
                return producer.records

            return await lag_while(work)
    finally:
        await receiver.stop()


def _p99(lags: list[float]) -> float:
    ordered = sorted(lags)
    return ordered[int(0.99 * (len(ordered) - 1))] if ordered else 0.0


async def main(spans: int, skip_before: bool) -> None:
    body = build(spans)
    print(f"request: {spans} chat spans, {len(body) / 1000:.0f} KB gzip")
    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} (other processes delay the loop too)")
    worst: dict[str, float] = {}
    phases = (
        [("idle", idle), ("after", after)] if skip_before else [("idle", idle), ("before", before), ("after", after)]
    )
    for name, run in phases:
        lags, events, elapsed = await run(body)
        worst[name] = max(lags, default=0.0)
        print(
            f"{name:>6}: {events} events in {elapsed:.1f} s; loop lag worst {worst[name] * 1000:.0f} ms, "
            f"p99 {_p99(lags) * 1000:.0f} ms over {len(lags)} ticks"
        )
    if "before" in worst and worst["after"] > 0:
        print(f"worst lag before / after: {worst['before'] / worst['after']:.0f}x")
    print(f"goal: worst lag under 100 ms -> {'met' if worst['after'] < 0.1 else 'NOT met'}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spans", type=int, default=40_000)
    parser.add_argument("--skip-before", action="store_true")
    args = parser.parse_args()
    asyncio.run(main(args.spans, args.skip_before))
