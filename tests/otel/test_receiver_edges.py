"""The OTLP receiver's edges: TLS through a web-config file, requests in flight and bytes waiting
bounded (503 busy with Retry-After, never a growing queue), idle connections making room."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import bcrypt
import httpx
import pytest
from prometheus_client import CollectorRegistry

from sidecar.errors import ConfigError
from sidecar.otel.config import OtelConfig, OtlpReceiverConfig
from sidecar.otel.metrics import OtelMetrics
from sidecar.otel.producer import KafkaUnavailable
from sidecar.otel.receiver import OtlpHttpReceiver
from tests.otel.conftest import refused
from tests.otel.test_receiver import RecordingProducer
from tests.otel.test_receiver_work import HeldIngest, payload
from tests.support.tls import Pki, make_pki

PROTO = {"Content-Type": "application/x-protobuf"}
TOKEN = {"Authorization": "Bearer s3cret"}


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


class PausedBroker(RecordingProducer):
    """A broker that takes records and never acknowledges them (paused): each batch times out."""

    async def produce(self, topic: str, records: Any, *, timeout_seconds: float, headers: Any = None) -> None:
        await asyncio.sleep(timeout_seconds)
        raise KafkaUnavailable(f"not acknowledged within {timeout_seconds}s")


def _receiver(
    registry: CollectorRegistry, producer: RecordingProducer | None = None, **settings: Any
) -> tuple[OtlpHttpReceiver, HeldIngest, RecordingProducer]:
    metrics = OtelMetrics(registry)
    ingest = HeldIngest(OtelConfig(), metrics, max_event_bytes=1 << 20)
    ingest.release.set()
    producer = producer or RecordingProducer()
    cfg = OtlpReceiverConfig(enabled=True, host="127.0.0.1", port=0, bearer_token="s3cret", **settings)
    receiver = OtlpHttpReceiver(cfg, ingest, producer, metrics, events_topic="events")  # type: ignore[arg-type]
    return receiver, ingest, producer


@pytest.fixture
async def tls_receiver(
    tmp_path: Path, pki: Pki, registry: CollectorRegistry
) -> AsyncIterator[tuple[OtlpHttpReceiver, RecordingProducer]]:
    web = tmp_path / "web.yml"
    web.write_text(
        f"tls_server_config:\n  cert_file: {pki.server_cert}\n  key_file: {pki.server_key}\n"
        "http_server_config:\n  headers:\n    Strict-Transport-Security: max-age=31536000\n"
    )
    receiver, _, producer = _receiver(registry, web_config_file=web)
    await receiver.start()
    try:
        yield receiver, producer
    finally:
        await receiver.stop()


async def test_tls_with_the_bearer_token(tls_receiver: tuple[OtlpHttpReceiver, RecordingProducer], pki: Pki) -> None:
    receiver, producer = tls_receiver
    url = f"https://127.0.0.1:{receiver.port}/v1/traces"
    async with httpx.AsyncClient(verify=pki.client_context()) as client:
        answer = await client.post(url, content=payload(1), headers={**PROTO, **TOKEN})
        assert answer.status_code == 200
        assert answer.headers["Strict-Transport-Security"] == "max-age=31536000"
        assert answer.headers["X-Content-Type-Options"] == "nosniff"
        assert (await client.post(url, content=payload(1, "x"), headers=PROTO)).status_code == 401
    assert len(producer.acked) == 5
    # Plain HTTP on the TLS port gets no answer.
    with pytest.raises(httpx.HTTPError):
        async with httpx.AsyncClient() as plain:
            await plain.post(f"http://127.0.0.1:{receiver.port}/v1/traces", content=payload(1), headers=PROTO)


def test_basic_auth_users_are_refused_on_the_receiver(tmp_path: Path) -> None:
    web = tmp_path / "web.yml"
    digest = bcrypt.hashpw(b"pw", bcrypt.gensalt(rounds=4)).decode()
    web.write_text(f"basic_auth_users:\n  admin: '{digest}'\n")
    with pytest.raises(ConfigError, match="bearer_token"):
        _receiver(CollectorRegistry(), web_config_file=web)


async def test_requests_in_flight_are_bounded(registry: CollectorRegistry) -> None:
    receiver, ingest, producer = _receiver(registry, max_requests_in_flight=2)
    ingest.release.clear()
    await receiver.start()
    url = f"http://127.0.0.1:{receiver.port}/v1/traces"
    try:
        async with httpx.AsyncClient(headers=TOKEN, timeout=30) as client:
            first = asyncio.ensure_future(client.post(url, content=payload(1, "a"), headers=PROTO))
            second = asyncio.ensure_future(client.post(url, content=payload(1, "b"), headers=PROTO))
            for _ in range(500):
                if ingest.started.is_set():
                    break
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.1)  # the second request is admitted and waits its turn
            third = await client.post(url, content=payload(1, "c"), headers=PROTO)
            assert third.status_code == 503
            assert third.headers["Retry-After"] == "5"
            assert "busy" in third.text
            ingest.release.set()
            assert (await first).status_code == 200
            assert (await second).status_code == 200
            assert (await client.post(url, content=payload(1, "c"), headers=PROTO)).status_code == 200
    finally:
        ingest.release.set()
        await receiver.stop()
    assert refused(registry, "busy", "receiver") == 1
    assert {k for k, _ in producer.acked} == {b"a-0", b"b-0", b"c-0"}


async def test_bytes_waiting_are_bounded_with_kafka_down(registry: CollectorRegistry) -> None:
    """Kafka never acknowledges: 25 large requests at once are answered, none queues past the bound."""
    body = payload(300, "big")
    receiver, _, _ = _receiver(
        registry,
        PausedBroker(),
        max_pending_bytes=2 * len(body) + 1,
        max_body_bytes=len(body),
        produce_timeout_seconds=0.5,
    )
    await receiver.start()
    try:
        async with httpx.AsyncClient(headers={**TOKEN, **PROTO}, timeout=60) as client:
            url = f"http://127.0.0.1:{receiver.port}/v1/traces"
            answers = await asyncio.gather(*(client.post(url, content=body) for _ in range(25)))
    finally:
        await receiver.stop()
    codes = [a.status_code for a in answers]
    assert set(codes) == {503}
    busy = sum("busy" in a.text for a in answers)
    assert busy >= 23  # at most two bodies of this size wait at once
    assert all(a.headers["Retry-After"] == "5" for a in answers)
    assert refused(registry, "busy", "receiver") == busy


async def test_a_slow_body_gets_408_and_frees_its_slot(registry: CollectorRegistry) -> None:
    receiver, _, producer = _receiver(
        registry, max_requests_in_flight=1, body_timeout_seconds=0.5, min_body_bytes_per_second=1024 * 1024
    )
    await receiver.start()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", receiver.port)
        writer.write(
            b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer s3cret\r\n"
            b"Content-Type: application/x-protobuf\r\nContent-Length: 1000\r\n\r\n" + b"\x0a" * 10
        )
        await writer.drain()
        async with asyncio.timeout(30):
            answer = await reader.read()  # the server answers and closes
        writer.close()
        assert answer.startswith(b"HTTP/1.1 408 ")
        assert b"too_slow" in answer
        async with httpx.AsyncClient(headers={**TOKEN, **PROTO}) as client:
            ok = await client.post(f"http://127.0.0.1:{receiver.port}/v1/traces", content=payload(1, "after"))
        assert ok.status_code == 200
    finally:
        await receiver.stop()
    assert refused(registry, "too_slow", "receiver") == 1
    assert {k for k, _ in producer.acked} == {b"after-0"}
