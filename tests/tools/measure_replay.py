"""Measure the replay tools and the telemetry server (prints figures; asserts nothing).

    python tests/tools/measure_replay.py

* event building + interleaving over the bundled sample, events/s (pure Python, one core);
* producing to the librdkafka mock cluster with no rate limit, events/s, against a baseline of
  the same producer sending one event at a time with ``send_and_wait`` (the ratio is what the
  pipelined sends buy);
* ``GET /metrics`` round trips per second from one client over keep-alive.
"""

from __future__ import annotations

import asyncio
import time

import aiohttp
from aiokafka import AIOKafkaProducer
from prometheus_client import CollectorRegistry, Counter

from sidecar.telemetry.config import HttpConfig
from sidecar.telemetry.http import HttpServer
from sidecar.tools.demo.mock_cluster import MockKafkaCluster
from sidecar.tools.demo.replay import conversation_events, encode, interleave, load_sample, produce


def _events(rounds: int) -> list[dict[str, object]]:
    sample = load_sample()
    convs = (
        conversation_events(r, conversation_id=f"{r['conversation_id']}#{i}") for i in range(rounds) for r in sample
    )
    return list(interleave(convs, concurrency=50, seed=0))


async def _baseline(bootstrap: str, events: list[dict[str, object]]) -> float:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        t0 = time.perf_counter()
        for ev in events:
            key, value = encode(ev)
            await producer.send_and_wait("bench-baseline", value=value, key=key)
        return len(events) / (time.perf_counter() - t0)
    finally:
        await producer.stop()


async def _scrapes(seconds: float) -> float:
    reg = CollectorRegistry()
    c = Counter("sidecar_bench_total", "bench", ["kind"], registry=reg)
    for i in range(50):
        c.labels(f"k{i}").inc(i)
    async with HttpServer(HttpConfig(host="127.0.0.1", port=0), reg, []) as srv:
        url = f"http://127.0.0.1:{srv.port}/metrics"
        n = 0
        async with aiohttp.ClientSession() as s:
            t0 = time.perf_counter()
            while time.perf_counter() - t0 < seconds:
                async with s.get(url) as r:
                    await r.read()
                n += 1
        return n / (time.perf_counter() - t0)


def main() -> None:
    t0 = time.perf_counter()
    events = _events(rounds=5)
    build = len(events) / (time.perf_counter() - t0)
    print(f"build+interleave: {len(events)} events, {build:,.0f} events/s")
    with MockKafkaCluster() as kafka:
        n = 20_000
        t0 = time.perf_counter()
        sent = asyncio.run(produce(kafka.bootstrap_servers, "bench-produce", events[:n], rate=None))
        pipelined = sent / (time.perf_counter() - t0)
        base = asyncio.run(_baseline(kafka.bootstrap_servers, events[:2000]))
    print(f"produce (pipelined, acks=all): {pipelined:,.0f} events/s")
    print(f"baseline send_and_wait one by one: {base:,.0f} events/s; ratio {pipelined / base:.1f}x")
    print(f"GET /metrics (50 series, keep-alive, one client): {asyncio.run(_scrapes(3.0)):,.0f} req/s")


if __name__ == "__main__":
    main()
