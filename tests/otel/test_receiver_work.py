"""The receiver's work per request: off the event loop, one derivation at a time, within a budget.

Proven by structure, never by a clock: a derivation held inside its worker thread while the test
probes ``/healthz`` on the same event loop; a blocked derivation past ``max_work_seconds``."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry

from sidecar.otel.config import OtelConfig, OtlpReceiverConfig
from sidecar.otel.found import Derived
from sidecar.otel.ingest import OtelIngest
from sidecar.otel.metrics import OtelMetrics
from sidecar.otel.receiver import OtlpHttpReceiver
from sidecar.otel.work import work_for
from sidecar.telemetry.config import HttpConfig
from sidecar.telemetry.http import HttpServer
from tests.otel.conftest import refused
from tests.otel.spans import chat_attrs, conversation, make_span, traces
from tests.otel.test_receiver import RecordingProducer

PROTO = {"Content-Type": "application/x-protobuf"}


class HeldIngest(OtelIngest):
    """An ingest whose derivations wait for the test's word, noting the thread they ran on."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.started = threading.Event()
        self.release = threading.Event()
        self.threads: list[int] = []

    def derive(self, data: Any, door: str) -> Derived:
        self.threads.append(threading.get_ident())
        self.started.set()
        self.release.wait(30)  # never reached in a passing test: the test releases it
        return super().derive(data, door)


def payload(n: int, tag: str = "c") -> bytes:
    spans = [make_span(chat_attrs("genai", conversation(1), f"{tag}-{i}")) for i in range(n)]
    return traces(spans).SerializeToString()


@pytest.fixture
async def doors(registry: CollectorRegistry) -> AsyncIterator[tuple[HeldIngest, OtlpHttpReceiver, RecordingProducer]]:
    metrics = OtelMetrics(registry)
    ingest = HeldIngest(OtelConfig(), metrics, max_event_bytes=1 << 20)
    producer = RecordingProducer()
    cfg = OtlpReceiverConfig(
        enabled=True,
        host="127.0.0.1",
        port=0,
        allow_unauthenticated=True,
        max_spans_per_request=50,
        max_work_seconds=0.5,
    )
    receiver = OtlpHttpReceiver(cfg, ingest, producer, metrics, events_topic="events")  # type: ignore[arg-type]
    await receiver.start()
    try:
        yield ingest, receiver, producer
    finally:
        ingest.release.set()
        await receiver.stop()


async def _until(event: threading.Event) -> None:
    for _ in range(500):
        if event.is_set():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the derivation never started")


async def test_derivation_runs_off_the_loop_and_healthz_answers_meanwhile(registry: CollectorRegistry) -> None:
    metrics = OtelMetrics(registry)
    ingest = HeldIngest(OtelConfig(), metrics, max_event_bytes=1 << 20)
    producer = RecordingProducer()
    cfg = OtlpReceiverConfig(enabled=True, host="127.0.0.1", port=0, allow_unauthenticated=True)
    receiver = OtlpHttpReceiver(cfg, ingest, producer, metrics, events_topic="events")  # type: ignore[arg-type]
    health = HttpServer(HttpConfig(host="127.0.0.1", port=0), CollectorRegistry(), [])
    await receiver.start()
    await health.start()
    try:
        async with httpx.AsyncClient(timeout=30) as client:
            post = asyncio.ensure_future(
                client.post(f"http://127.0.0.1:{receiver.port}/v1/traces", content=payload(3), headers=PROTO)
            )
            await _until(ingest.started)
            # The derivation is in progress (held in its thread): the loop still answers the probe.
            probe = await client.get(f"http://127.0.0.1:{health.port}/healthz")
            assert probe.status_code == 200
            assert not post.done()
            ingest.release.set()
            answer = await post
        assert answer.status_code == 200
        assert ingest.threads and threading.get_ident() not in ingest.threads
        assert len(producer.acked) == 3 * 5
    finally:
        ingest.release.set()
        await health.stop()
        await receiver.stop()


async def test_too_many_spans_is_413_before_any_derivation(
    doors: tuple[HeldIngest, OtlpHttpReceiver, RecordingProducer], registry: CollectorRegistry
) -> None:
    ingest, receiver, producer = doors
    async with httpx.AsyncClient() as client:
        answer = await client.post(f"http://127.0.0.1:{receiver.port}/v1/traces", content=payload(51), headers=PROTO)
    assert answer.status_code == 413
    assert "too_many_spans" in answer.text
    assert refused(registry, "too_many_spans", "receiver") == 1
    assert not ingest.threads and not producer.acked


async def test_over_budget_is_429_with_retry_after_and_a_retry_delivers_everything(
    doors: tuple[HeldIngest, OtlpHttpReceiver, RecordingProducer], registry: CollectorRegistry
) -> None:
    ingest, receiver, producer = doors
    url = f"http://127.0.0.1:{receiver.port}/v1/traces"
    body = payload(2, "late")
    async with httpx.AsyncClient(timeout=30) as client:
        answer = await client.post(url, content=body, headers=PROTO)  # held past max_work_seconds
        assert answer.status_code == 429
        assert answer.headers["Retry-After"] == "5"
        assert "over_budget" in answer.text
        assert refused(registry, "over_budget", "receiver") == 1
        assert not producer.acked
        # The abandoned derivation finishes in the background; its conversations are forgotten,
        # so the exporter's retry derives (and delivers) them in full.
        ingest.release.set()
        retry = await client.post(url, content=body, headers=PROTO)
    assert retry.status_code == 200
    assert len(producer.acked) == 2 * 5


async def test_both_doors_share_one_queue_of_derivations(registry: CollectorRegistry) -> None:
    ingest = OtelIngest(OtelConfig(), OtelMetrics(registry), max_event_bytes=1 << 20)
    other = OtelIngest(OtelConfig(), OtelMetrics(CollectorRegistry()), max_event_bytes=1 << 20)
    assert work_for(ingest) is work_for(ingest)
    assert work_for(ingest) is not work_for(other)
    order: list[str] = []
    gate = threading.Event()

    def first() -> str:
        gate.wait(30)
        order.append("first")
        return "first"

    def second() -> str:
        order.append("second")
        return "second"

    a = asyncio.ensure_future(work_for(ingest).run(first))
    await asyncio.sleep(0.05)
    b = asyncio.ensure_future(work_for(ingest).run(second))
    await asyncio.sleep(0.05)
    assert order == [] and work_for(ingest).busy
    gate.set()
    assert await a == "first" and await b == "second"
    assert order == ["first", "second"]
