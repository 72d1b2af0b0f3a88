"""aiohttp's own answers (its parser's 400s) on every listener: the security headers, a fixed text
that never echoes the request, no error log line, and no version banner on any response."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import pytest
from prometheus_client import CollectorRegistry

from sidecar.otel.config import OtelConfig, OtlpReceiverConfig
from sidecar.otel.ingest import OtelIngest
from sidecar.otel.metrics import OtelMetrics
from sidecar.otel.receiver import OtlpHttpReceiver
from sidecar.telemetry.config import HttpConfig
from sidecar.telemetry.http import HttpServer
from tests.otel.test_receiver import RecordingProducer

MARKER = b"<script>x1y2z3</script>"
HOSTILE = [
    b"GET /healthz HTTP/1.1\r\nHost: x\r\nBad Header " + MARKER + b"\r\n\r\n",
    MARKER + b"\x00\x01 not http\r\n\r\n",
    b"GET /" + MARKER + b" HTTP/9.9\r\n\r\n",
]


@pytest.fixture
async def ports() -> AsyncIterator[dict[str, int]]:
    """A scrape, an operator and an OTLP listener, all running."""
    registry = CollectorRegistry()
    config = HttpConfig.model_validate({"host": "127.0.0.1", "port": 0, "operator": {"port": 0}})
    metrics = OtelMetrics(registry)
    ingest = OtelIngest(OtelConfig(), metrics, max_event_bytes=1 << 20)
    receiver = OtlpHttpReceiver(
        OtlpReceiverConfig(enabled=True, host="127.0.0.1", port=0, allow_unauthenticated=True),
        ingest,
        RecordingProducer(),  # type: ignore[arg-type]
        metrics,
        events_topic="events",
    )
    async with HttpServer(config, registry, []) as srv:
        await receiver.start()
        try:
            yield {**srv.ports, "otlp": receiver.port}
        finally:
            await receiver.stop()


async def _send(port: int, raw: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(raw)
        await writer.drain()
        async with asyncio.timeout(10):
            return await reader.read()
    finally:
        writer.close()


def _headers(raw: bytes) -> dict[str, str]:
    head = raw.split(b"\r\n\r\n", 1)[0].decode("latin-1").split("\r\n")[1:]
    return {k.lower(): v.strip() for k, v in (line.split(":", 1) for line in head)}


@pytest.mark.parametrize("listener", ["scrape", "operator", "otlp"])
async def test_parser_errors_are_plain_quiet_and_carry_the_headers(
    ports: dict[str, int], listener: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    for raw in HOSTILE:
        answer = await _send(ports[listener], raw)
        assert answer.split(b" ", 2)[1] == b"400", answer[:80]
        headers = _headers(answer)
        assert headers["x-content-type-options"] == "nosniff"
        assert "default-src 'none'" in headers["content-security-policy"]
        assert headers["server"] == "sidecar"
        body = answer.split(b"\r\n\r\n", 1)[1]
        assert body == b"400 Bad Request\n"
        assert b"x1y2z3" not in answer
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


@pytest.mark.parametrize(
    ("listener", "request_line"),
    [
        ("scrape", b"GET /healthz"),
        ("scrape", b"GET /nowhere"),
        ("operator", b"GET /nowhere"),
        ("otlp", b"GET /v1/traces"),
    ],
)
async def test_no_version_banner(ports: dict[str, int], listener: str, request_line: bytes) -> None:
    answer = await _send(ports[listener], request_line + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert _headers(answer)["server"] == "sidecar"
    assert b"aiohttp" not in answer and b"Python" not in answer
