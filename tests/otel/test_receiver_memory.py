"""Memory stays bounded while the broker is paused: 25 large OTLP requests at once against a real
(librdkafka mock) cluster whose process is stopped (SIGSTOP), so nothing is acknowledged.

Each request holds 4,000 chat spans (about 37 KB of gzip, 1.5 MB decoded). Before the receiver's
admission bounds and its one-at-a-time decoding, every waiting request held its decoded payload:
the process grew by 132 MB here (and grows with the number of requests). Now at most
``max_requests_in_flight`` bodies wait (as sent) and one is decoded at a time: 5 MB. The bound
asserted, 64 MB, leaves room for one derivation and the Kafka client's buffers."""

from __future__ import annotations

import asyncio
import gzip
import os
import signal

import httpx
from prometheus_client import CollectorRegistry

from sidecar.otel.config import OtelConfig, OtlpReceiverConfig
from sidecar.otel.ingest import OtelIngest
from sidecar.otel.metrics import OtelMetrics
from sidecar.otel.producer import OtelEventProducer
from sidecar.otel.receiver import OtlpHttpReceiver
from sidecar.source.config import KafkaConfig
from sidecar.tools.demo.mock_cluster import MockKafkaCluster
from tests.otel.spans import chat_attrs, make_span, traces

REQUESTS = 25
SPANS = 4_000
GROWTH_BOUND_BYTES = 64 * 1_048_576


def _rss() -> int:
    with open("/proc/self/statm", encoding="ascii") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _body(tag: str) -> bytes:
    history = [{"role": "user", "content": "Where is my order?"}, {"role": "assistant", "content": "On its way."}]
    return gzip.compress(
        traces(make_span(chat_attrs("genai", history, f"{tag}-{i}")) for i in range(SPANS)).SerializeToString()
    )


async def test_memory_stays_bounded_with_the_broker_paused() -> None:
    with MockKafkaCluster(1) as cluster:
        registry = CollectorRegistry()
        metrics = OtelMetrics(registry)
        producer = OtelEventProducer(
            KafkaConfig(bootstrap_servers=cluster.bootstrap_servers, topic="mem-events", request_timeout_ms=5000)
        )
        cfg = OtlpReceiverConfig(
            enabled=True,
            host="127.0.0.1",
            port=0,
            allow_unauthenticated=True,
            produce_timeout_seconds=2.0,
            max_work_seconds=120,
        )
        ingest = OtelIngest(OtelConfig(), metrics, max_event_bytes=1 << 20)
        receiver = OtlpHttpReceiver(cfg, ingest, producer, metrics, events_topic="mem-events")
        headers = {"Content-Type": "application/x-protobuf", "Content-Encoding": "gzip"}
        bodies = [_body(f"r{n}") for n in range(REQUESTS)]
        await receiver.start()
        pid = cluster._proc.pid  # type: ignore[union-attr]
        try:
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{receiver.port}", timeout=300) as client:
                warm = await client.post("/v1/traces", content=_body("warm"), headers=headers)
                assert warm.status_code == 200
                os.kill(pid, signal.SIGSTOP)
                before = peak = _rss()
                sampling = True

                async def sample() -> None:
                    nonlocal peak
                    while sampling:
                        peak = max(peak, _rss())
                        await asyncio.sleep(0.05)

                sampler = asyncio.ensure_future(sample())
                answers = await asyncio.gather(*(client.post("/v1/traces", content=b, headers=headers) for b in bodies))
                sampling = False
                await sampler
        finally:
            os.kill(pid, signal.SIGCONT)
            await receiver.stop()
            await producer.stop()
    assert {a.status_code for a in answers} == {503}
    assert all("Retry-After" in a.headers for a in answers)
    busy = registry.get_sample_value("sidecar_otel_refused_total", {"door": "receiver", "reason": "busy"}) or 0
    assert busy >= REQUESTS - cfg.max_requests_in_flight
    growth = peak - before
    print(f"resident memory growth over {REQUESTS} requests with the broker paused: {growth / 1_048_576:.0f} MB")
    assert growth < GROWTH_BOUND_BYTES
