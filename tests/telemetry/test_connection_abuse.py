"""Clients that hold connections without using them cannot starve the probes.

With the default ``max_connections`` (64), more idle, slow (headers a byte at a time) or freshly
flooded connections than that are held open, and reopened as the server closes them, while
``/healthz`` is probed: every probe is answered 200."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from prometheus_client import CollectorRegistry

from sidecar.telemetry.config import HttpConfig
from sidecar.telemetry.http import HttpServer

PROBE = b"GET /healthz HTTP/1.1\r\nHost: probe\r\nConnection: close\r\n\r\n"
HELD = 80  # more than max_connections' default of 64
PROBES = 20


@pytest.fixture
async def server() -> AsyncIterator[HttpServer]:
    config = HttpConfig(host="127.0.0.1", port=0)
    assert config.max_connections == 64
    async with HttpServer(config, CollectorRegistry(), []) as srv:
        yield srv


async def _probe(port: int) -> int:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(PROBE)
        await writer.drain()
        async with asyncio.timeout(10):
            raw = await reader.read()
        return int(raw.split(b" ", 2)[1]) if raw.startswith(b"HTTP/1.1 ") else 0
    finally:
        writer.close()


async def _hold(port: int, behave: Callable[[asyncio.StreamWriter], Awaitable[None]], stop: asyncio.Event) -> None:
    """One abusive client: connect, behave, and reconnect whenever the server closes it."""
    while not stop.is_set():
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            await asyncio.sleep(0.01)
            continue
        try:
            behaving = asyncio.ensure_future(behave(writer))
            closed = asyncio.ensure_future(reader.read())
            stopping = asyncio.ensure_future(stop.wait())
            await asyncio.wait({behaving, closed, stopping}, return_when=asyncio.FIRST_COMPLETED)
            for t in (behaving, closed, stopping):
                t.cancel()
        except OSError:
            pass
        finally:
            writer.close()


async def _idle(_writer: asyncio.StreamWriter) -> None:
    await asyncio.Event().wait()


async def _slow(writer: asyncio.StreamWriter) -> None:
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: ")
    while True:
        await asyncio.sleep(0.2)
        writer.write(b"a")
        await writer.drain()


async def _probes_while(server: HttpServer, behave: Callable[[asyncio.StreamWriter], Awaitable[None]]) -> list[int]:
    stop = asyncio.Event()
    clients = [asyncio.ensure_future(_hold(server.port, behave, stop)) for _ in range(HELD)]
    try:
        await asyncio.sleep(0.5)  # every slot taken, and reconnects racing the probes
        statuses = []
        for _ in range(PROBES):
            statuses.append(await _probe(server.port))
            await asyncio.sleep(0.05)
        return statuses
    finally:
        stop.set()
        for c in clients:
            c.cancel()
        with contextlib.suppress(BaseException):
            await asyncio.gather(*clients, return_exceptions=True)


async def test_idle_connections_held_and_reopened_do_not_starve_healthz(server: HttpServer) -> None:
    assert await _probes_while(server, _idle) == [200] * PROBES


async def test_slow_header_connections_do_not_starve_healthz(server: HttpServer) -> None:
    assert await _probes_while(server, _slow) == [200] * PROBES


async def test_a_connection_flood_does_not_starve_healthz(server: HttpServer) -> None:
    stop = asyncio.Event()

    async def flood() -> None:
        # Bursts of 50 new connections, each burst kept open until the next one is made (50 to 100
        # open at a time, at most 64 of them accepted).
        previous: list[object] = []
        while not stop.is_set():
            burst = await asyncio.gather(
                *(asyncio.open_connection("127.0.0.1", server.port) for _ in range(50)), return_exceptions=True
            )
            for conn in previous:
                if isinstance(conn, tuple):
                    conn[1].close()
            previous = list(burst)
            await asyncio.sleep(0.05)
        for conn in previous:
            if isinstance(conn, tuple):
                conn[1].close()

    flooding = asyncio.ensure_future(flood())
    try:
        await asyncio.sleep(0.2)
        statuses = [await _probe(server.port) for _ in range(PROBES)]
    finally:
        stop.set()
        await flooding
    assert statuses == [200] * PROBES
