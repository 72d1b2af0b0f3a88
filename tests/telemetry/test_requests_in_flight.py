"""Requests in flight are bounded on the scrape and operator listeners, and the probes keep answering.

Slow request bodies (a client that announces 60 KB and sends none of it) and route handlers that
do not return hold requests in progress. Past ``http.max_requests_in_flight`` one more request gets
503 with ``Retry-After`` before anything is read, while ``/healthz`` and ``/readyz`` answer 200
throughout, also with more idle connections than ``max_connections`` held on top."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from pydantic import ValidationError

from sidecar.telemetry.config import HttpConfig
from sidecar.telemetry.http import HttpServer

SLOW_BODY = b"GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\nContent-Length: 60000\r\n\r\nab"


async def _ask(port: int, request: bytes, *, within: float = 10.0) -> tuple[int, dict[str, str]]:
    """Send one request, read the answer until the server closes; status and headers."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        await writer.drain()
        async with asyncio.timeout(within):
            raw = await reader.read()
    finally:
        writer.close()
    head = raw.split(b"\r\n\r\n", 1)[0].decode("latin-1").split("\r\n")
    if not head[0].startswith("HTTP/1.1 "):
        return 0, {}
    headers = dict(line.split(": ", 1) for line in head[1:] if ": " in line)
    return int(head[0].split(" ")[1]), headers


def _get(path: str) -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode()


async def _hold(port: int, request: bytes, n: int) -> list[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    held = []
    for _ in range(n):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(request)
        await writer.drain()
        held.append((reader, writer))
    await asyncio.sleep(0.2)  # the server has read every request's headers
    return held


def _close(held: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]]) -> None:
    for _, writer in held:
        writer.close()


@pytest.fixture
async def hanging() -> AsyncIterator[tuple[asyncio.Event, list[int]]]:
    release = asyncio.Event()
    entered: list[int] = []
    yield release, entered
    release.set()


def _routes(release: asyncio.Event, entered: list[int]) -> dict[str, Any]:
    async def clusters() -> object:
        entered.append(1)
        await release.wait()
        return {"goals": []}

    return {"clusters": clusters}


def test_the_default_is_half_of_max_connections_and_must_stay_below_it() -> None:
    assert HttpConfig().requests_in_flight_limit == 32
    assert HttpConfig(max_connections=8).requests_in_flight_limit == 4
    assert HttpConfig(max_connections=8, max_requests_in_flight=7).requests_in_flight_limit == 7
    with pytest.raises(ValidationError, match=r"must be below http\.max_connections"):
        HttpConfig(max_connections=8, max_requests_in_flight=8)
    with pytest.raises(ValidationError, match=r"must be below http\.max_connections"):
        HttpConfig(max_requests_in_flight=64)


async def test_slow_bodies_past_the_default_limit_get_503_and_the_probes_answer_with_idle_connections_held() -> None:
    """Defaults (but a body timeout longer than the test): 32 in flight of 64 connections. 40 slow
    bodies hold 32 slots, 8 get 503, 80 idle connections are held on top, every probe answers 200."""
    registry = CollectorRegistry()
    config = HttpConfig(host="127.0.0.1", port=0, request_timeout_seconds=120)
    async with HttpServer(config, registry, []) as srv:
        slow = await _hold(srv.port, SLOW_BODY, 40)
        reads = [asyncio.ensure_future(reader.read()) for reader, _ in slow]
        await asyncio.wait(reads, timeout=1.0)
        refused = [r.result() for r in reads if r.done()]
        for r in reads:
            r.cancel()
        assert len(refused) == 8
        assert all(r.startswith(b"HTTP/1.1 503 ") and b"Retry-After: 1" in r for r in refused)
        idle = [await asyncio.open_connection("127.0.0.1", srv.port) for _ in range(80)]
        try:
            statuses = []
            for path in ("/healthz", "/readyz") * 10:
                statuses.append((await _ask(srv.port, _get(path)))[0])
            status, headers = await _ask(srv.port, _get("/metrics"))
        finally:
            _close(slow)
            for _, writer in idle:
                writer.close()
        assert statuses == [200] * 20
        assert status == 503 and headers["Retry-After"] == "1"
        assert registry.get_sample_value("sidecar_http_requests_total", {"handler": "metrics", "code": "503"}) == 9
        assert not registry.get_sample_value("sidecar_http_connections_refused_total")
        # The held requests gave their slots back when their clients went away.
        statuses = []
        for _ in range(100):  # the server sees the closes on its next loop turns
            statuses.append((await _ask(srv.port, _get("/metrics")))[0])
            if statuses[-1] == 200:
                break
            await asyncio.sleep(0.05)  # polling a server from outside
        assert statuses[-1] == 200


async def test_a_saturated_json_route_on_the_shared_port_leaves_the_probes_answering(
    hanging: tuple[asyncio.Event, list[int]],
) -> None:
    release, entered = hanging
    config = HttpConfig(host="127.0.0.1", port=0, max_connections=8, max_requests_in_flight=3)
    async with HttpServer(config, CollectorRegistry(), [], _routes(release, entered)) as srv:
        held = await _hold(srv.port, _get("/clusters"), 3)
        try:
            assert len(entered) == 3
            status, headers = await _ask(srv.port, _get("/clusters"))
            assert (status, headers.get("Retry-After")) == (503, "1")
            assert (await _ask(srv.port, _get("/metrics")))[0] == 503  # every route but the probes shares it
            assert len(entered) == 3  # the refused request never reached the route
            assert [(await _ask(srv.port, _get(p)))[0] for p in ("/healthz", "/readyz") * 5] == [200] * 10
            release.set()
            for reader, _ in held:
                async with asyncio.timeout(5):
                    assert (await reader.read()).startswith(b"HTTP/1.1 200 ")
        finally:
            _close(held)
        assert (await _ask(srv.port, _get("/clusters")))[0] == 200


async def test_the_operator_listener_has_its_own_bound(hanging: tuple[asyncio.Event, list[int]]) -> None:
    release, entered = hanging
    config = HttpConfig.model_validate(
        {"host": "127.0.0.1", "port": 0, "operator": {"port": 0}, "max_connections": 4, "max_requests_in_flight": 2}
    )
    async with HttpServer(config, CollectorRegistry(), [], _routes(release, entered)) as srv:
        operator = srv.ports["operator"]
        held = await _hold(operator, _get("/clusters"), 2)
        try:
            assert (await _ask(operator, _get("/clusters")))[0] == 503
            assert [(await _ask(srv.ports["scrape"], _get(p)))[0] for p in ("/healthz", "/metrics")] == [200, 200]
        finally:
            release.set()
            _close(held)


@pytest.mark.parametrize(
    "framing", [b"Content-Length: 60000\r\n\r\nab", b"Transfer-Encoding: chunked\r\n\r\n2\r\nab\r\n"]
)
async def test_a_probe_with_a_body_is_refused_at_once_without_waiting_for_it(framing: bytes) -> None:
    """A slow body on /healthz would hold a connection that no limit counts: it is never read."""
    config = HttpConfig(host="127.0.0.1", port=0, request_timeout_seconds=120)
    async with HttpServer(config, CollectorRegistry(), []) as srv:
        for path in (b"/healthz", b"/readyz"):
            status, headers = await _ask(srv.port, b"GET " + path + b" HTTP/1.1\r\nHost: x\r\n" + framing, within=5)
            assert status == 413 and headers["Connection"] == "close"
