"""HttpServer over real sockets: endpoints, readiness, JSON routes and hostile clients."""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import PurePosixPath

import aiohttp
import pytest
from prometheus_client import CollectorRegistry, Counter
from prometheus_client.parser import text_string_to_metric_families

from sidecar.lifecycle import Health
from sidecar.telemetry.config import HttpConfig
from sidecar.telemetry.http import HttpServer

LIMIT = 2048


@dataclass
class Flag:
    name: str
    ready: bool = True
    detail: str = ""

    def health(self) -> Health:
        return Health(self.name, self.ready, self.detail)


class Exploding:
    def health(self) -> Health:
        raise RuntimeError("probe crashed")


def _config(port: int = 0) -> HttpConfig:
    return HttpConfig(host="127.0.0.1", port=port, max_request_bytes=LIMIT)


@pytest.fixture
def registry() -> CollectorRegistry:
    reg = CollectorRegistry()
    Counter("sidecar_demo_events_total", "events seen", ["kind"], registry=reg).labels("message").inc(3)
    return reg


@pytest.fixture
async def server(registry: CollectorRegistry) -> AsyncIterator[HttpServer]:
    srv = HttpServer(
        _config(),
        registry,
        [Flag("kafka"), Flag("vllm")],
        json_routes={"clusters": lambda: {"clusters": [{"id": 1, "label": "book a hotel"}]}},
    )
    await srv.start()
    yield srv
    await srv.stop()


def _url(srv: HttpServer, path: str) -> str:
    return f"http://127.0.0.1:{srv.port}{path}"


async def _raw(srv: HttpServer, payload: bytes, *, read_timeout: float = 5.0) -> bytes:
    """Send raw bytes, return whatever the server answers before closing (or the timeout)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", srv.port)
    try:
        writer.write(payload)
        await writer.drain()
        chunks = []
        try:
            async with asyncio.timeout(read_timeout):
                while chunk := await reader.read(65536):
                    chunks.append(chunk)
        except TimeoutError:
            pass
        return b"".join(chunks)
    except ConnectionResetError:
        return b""
    finally:
        writer.close()
        with contextlib.suppress(ConnectionResetError):
            await writer.wait_closed()


def _status(raw: bytes) -> int:
    assert raw.startswith((b"HTTP/1.1 ", b"HTTP/1.0 ")), raw[:80]
    return int(raw.split(b" ", 2)[1])


async def _still_healthy(srv: HttpServer) -> None:
    async with aiohttp.ClientSession() as s, s.get(_url(srv, "/healthz")) as r:
        assert r.status == 200


async def test_metrics_text_exposition(server: HttpServer) -> None:
    async with aiohttp.ClientSession() as s, s.get(_url(server, "/metrics")) as r:
        assert r.status == 200
        assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        text = await r.text()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    [sample] = [x for x in families["sidecar_demo_events"].samples if x.name.endswith("_total")]
    assert sample.labels == {"kind": "message"}
    assert sample.value == 3.0


async def test_metrics_openmetrics_when_asked(server: HttpServer) -> None:
    headers = {"Accept": "application/openmetrics-text; version=1.0.0; charset=utf-8"}
    async with aiohttp.ClientSession() as s, s.get(_url(server, "/metrics"), headers=headers) as r:
        assert r.status == 200
        assert r.headers["Content-Type"].startswith("application/openmetrics-text")
        assert (await r.text()).rstrip().endswith("# EOF")


async def test_metrics_gzip_when_accepted(server: HttpServer) -> None:
    async with aiohttp.ClientSession() as s:
        async with s.get(_url(server, "/metrics"), headers={"Accept-Encoding": "gzip"}) as r:
            assert r.headers.get("Content-Encoding") == "gzip"
            assert "sidecar_demo_events_total" in await r.text()
        async with s.get(_url(server, "/metrics"), headers={"Accept-Encoding": "identity"}) as r:
            assert "Content-Encoding" not in r.headers


async def test_healthz_and_head(server: HttpServer) -> None:
    async with aiohttp.ClientSession() as s:
        async with s.get(_url(server, "/healthz")) as r:
            assert r.status == 200
            assert await r.json() == {"status": "ok"}
        async with s.head(_url(server, "/metrics")) as r:
            assert r.status == 200


async def test_readyz_follows_reporters(registry: CollectorRegistry) -> None:
    kafka, vllm = Flag("kafka"), Flag("vllm", ready=False, detail="connection refused")
    config = HttpConfig(host="127.0.0.1", port=0, max_request_bytes=LIMIT, readiness="dependencies")
    async with HttpServer(config, registry, [kafka, vllm]) as srv, aiohttp.ClientSession() as s:
        async with s.get(_url(srv, "/readyz")) as r:
            assert r.status == 503
            body = await r.json()
        assert body == {
            "ready": False,
            "checks": [
                {"name": "kafka", "ready": True, "gates": True, "detail": ""},
                {"name": "vllm", "ready": False, "gates": True, "detail": "connection refused"},
            ],
        }
        vllm.ready, vllm.detail = True, ""
        async with s.get(_url(srv, "/readyz")) as r:
            assert r.status == 200
            assert (await r.json())["ready"] is True
        kafka.ready = False
        async with s.get(_url(srv, "/readyz")) as r:
            assert r.status == 503


async def test_readyz_reporter_that_raises_is_not_ready(registry: CollectorRegistry) -> None:
    core = ("kafka", "Exploding")
    async with HttpServer(_config(), registry, [Flag("kafka"), Exploding()], core_checks=core) as srv:
        async with aiohttp.ClientSession() as s, s.get(_url(srv, "/readyz")) as r:
            assert r.status == 503
            checks = (await r.json())["checks"]
        detail = "health() raised RuntimeError"
        assert checks[1] == {"name": "Exploding", "ready": False, "gates": True, "detail": detail}
        await _still_healthy(srv)


async def test_readyz_with_no_reporters_is_ready(registry: CollectorRegistry) -> None:
    async with (
        HttpServer(_config(), registry, []) as srv,
        aiohttp.ClientSession() as s,
        s.get(_url(srv, "/readyz")) as r,
    ):
        assert r.status == 200


async def test_json_routes_sync_async_and_failing(registry: CollectorRegistry) -> None:
    async def goals() -> object:
        await asyncio.sleep(0)
        return [{"goal": "rebook flight", "share": 0.5}]

    def broken() -> object:
        raise KeyError("no clustering yet")

    routes: dict[str, Callable[[], object]] = {
        "clusters": lambda: {"n": 2, "non_json": PurePosixPath("a/b")},
        "goals": goals,
        "broken": broken,
    }
    async with HttpServer(_config(), registry, [], json_routes=routes) as srv:
        async with aiohttp.ClientSession() as s:
            async with s.get(_url(srv, "/clusters")) as r:
                assert r.status == 200
                assert r.headers["Content-Type"].startswith("application/json")
                assert await r.json() == {"n": 2, "non_json": "a/b"}
            async with s.get(_url(srv, "/goals")) as r:
                assert await r.json() == [{"goal": "rebook flight", "share": 0.5}]
            async with s.get(_url(srv, "/broken")) as r:
                assert r.status == 500
                assert await r.json() == {"error": "internal error"}
        await _still_healthy(srv)


@pytest.mark.parametrize("name", ["metrics", "readyz", "", "../etc", "a/b", "Upper", "x" * 65, "sp ace"])
def test_invalid_json_route_names_rejected(registry: CollectorRegistry, name: str) -> None:
    with pytest.raises(ValueError, match="invalid JSON route name"):
        HttpServer(_config(), registry, [], json_routes={name: dict})


async def test_unknown_path_404_and_wrong_method_405(server: HttpServer) -> None:
    async with aiohttp.ClientSession() as s:
        for path in ["/", "/nope", "/metrics/extra", "/%2e%2e/etc/passwd", "/clusters?x=" + "y" * 100]:
            async with s.get(_url(server, path)) as r:
                assert r.status == (200 if path.startswith("/clusters") else 404), path
        for method in ["POST", "PUT", "DELETE", "PATCH"]:
            async with s.request(method, _url(server, "/metrics")) as r:
                assert r.status == 405
                assert "GET" in r.headers["Allow"]


async def test_body_over_limit_is_413(server: HttpServer) -> None:
    async with aiohttp.ClientSession() as s:
        async with s.post(_url(server, "/metrics"), data=b"x" * (LIMIT + 1)) as r:
            assert r.status == 413
        async with s.get(_url(server, "/healthz"), data=b"x" * (LIMIT + 1)) as r:
            assert r.status == 413
        # At the limit it is not the size that is refused, but a probe takes no body at all: it is
        # answered at once, never waiting for one (test_requests_in_flight.py).
        async with s.get(_url(server, "/metrics"), data=b"x" * LIMIT) as r:
            assert r.status == 200
        async with s.get(_url(server, "/healthz"), data=b"x") as r:
            assert r.status == 413


async def test_announced_length_over_limit_is_413_without_reading_body(server: HttpServer) -> None:
    # The server answers at once and closes; it does not wait for the 1 GB it was promised.
    raw = await _raw(server, b"GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 999999999\r\n\r\n", read_timeout=4.0)
    assert _status(raw) == 413
    await _still_healthy(server)


async def test_chunked_body_over_limit_is_413(server: HttpServer) -> None:
    chunk = b"x" * 1000
    body = b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for _ in range(5)) + b"0\r\n\r\n"
    head = b"POST /healthz HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    raw = await _raw(server, head + body)
    assert _status(raw) == 413
    await _still_healthy(server)


async def test_very_long_url_is_refused(server: HttpServer) -> None:
    raw = await _raw(server, b"GET /" + b"a" * 100_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n")
    assert raw == b"" or 400 <= _status(raw) < 500
    await _still_healthy(server)


async def test_header_flood_and_huge_header_are_refused(server: HttpServer) -> None:
    flood = b"".join(b"X-H%d: v\r\n" % i for i in range(500))
    raw = await _raw(server, b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + flood + b"\r\n")
    assert raw == b"" or 400 <= _status(raw) < 500
    raw = await _raw(server, b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"b" * 20_000 + b"\r\n\r\n")
    assert raw == b"" or 400 <= _status(raw) < 500
    await _still_healthy(server)


async def test_garbage_on_the_socket_does_not_crash(server: HttpServer) -> None:
    rng = random.Random(7)
    payloads = [
        b"\x00\xff\xfe" * 100,
        b"GET\r\n\r\n",
        b"HELLO / HTTP/9.9\r\n\r\n",
        b"GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n",
        b"GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03",  # a TLS ClientHello on a plain port
        *(bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 4096))) for _ in range(20)),
    ]
    for payload in payloads:
        raw = await _raw(server, payload, read_timeout=2.0)
        assert raw == b"" or _status(raw) >= 400
    await _still_healthy(server)


async def test_many_idle_connections_do_not_block_scrapes(server: HttpServer) -> None:
    conns = [await asyncio.open_connection("127.0.0.1", server.port) for _ in range(60)]  # limit is 64
    try:
        for _, w in conns[:30]:
            w.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")  # headers never finished
        async with aiohttp.ClientSession() as s, s.get(_url(server, "/metrics")) as r:
            assert r.status == 200
    finally:
        for _, w in conns:
            w.close()


async def test_request_counter_uses_closed_label_set(server: HttpServer, registry: CollectorRegistry) -> None:
    async with aiohttp.ClientSession() as s:
        for path in ["/healthz", "/clusters", "/random-1", "/random-2", "/etc/passwd"]:
            async with s.get(_url(server, path)):
                pass
        async with s.post(_url(server, "/metrics")):
            pass

    def value(handler: str, code: str) -> float | None:
        return registry.get_sample_value("sidecar_http_requests_total", {"handler": handler, "code": code})

    assert value("healthz", "200") == 1.0
    assert value("clusters", "200") == 1.0
    assert value("other", "404") == 3.0
    assert value("metrics", "405") == 1.0


async def test_lifecycle_port_zero_idempotent_stop_and_restart_errors(registry: CollectorRegistry) -> None:
    srv = HttpServer(_config(), registry, [])
    await srv.stop()  # safe without start
    with pytest.raises(RuntimeError):
        _ = srv.port
    await srv.start()
    assert srv.port > 0
    with pytest.raises(RuntimeError, match="already started"):
        await srv.start()
    port = srv.port
    await srv.stop()
    await srv.stop()
    with pytest.raises(ConnectionRefusedError):
        await asyncio.open_connection("127.0.0.1", port)


async def test_port_in_use_raises_and_leaves_server_stoppable() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        srv = HttpServer(_config(port), CollectorRegistry(), [])
        with pytest.raises(OSError, match="address already in use"):
            await srv.start()
        await srv.stop()
        with pytest.raises(RuntimeError):
            _ = srv.port


class _BrokenCollector:
    def collect(self) -> list[object]:
        raise RuntimeError("collector bug")


async def test_failing_collector_gives_500_and_server_survives() -> None:
    reg = CollectorRegistry()
    async with HttpServer(_config(), reg, []) as srv:
        reg.register(_BrokenCollector())  # type: ignore[arg-type]
        async with aiohttp.ClientSession() as s, s.get(_url(srv, "/metrics")) as r:
            assert r.status == 500
        await _still_healthy(srv)


async def test_half_sent_requests_are_dropped_after_the_idle_timeout() -> None:
    config = HttpConfig(host="127.0.0.1", port=0, keepalive_timeout_seconds=0.5)
    async with HttpServer(config, CollectorRegistry(), []) as srv:
        for payload in [b"", b"GET /healthz HTTP/1.1\r\nHost: x\r\n"]:  # silent; headers never finished
            reader, writer = await asyncio.open_connection("127.0.0.1", srv.port)
            writer.write(payload)
            async with asyncio.timeout(10):
                assert await reader.read() == b""  # the server closed it
            writer.close()


async def test_slowly_sent_body_gets_408_and_a_closed_connection(registry: CollectorRegistry) -> None:
    config = HttpConfig(host="127.0.0.1", port=0, max_request_bytes=LIMIT, request_timeout_seconds=0.5)
    async with HttpServer(config, registry, []) as srv:
        reader, writer = await asyncio.open_connection("127.0.0.1", srv.port)
        writer.write(b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n" + b"a" * 10)
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        async with asyncio.timeout(10):
            raw = b""
            while chunk := await reader.read(65536):  # ends when the server closes
                raw += chunk
        assert _status(raw) == 408
        assert loop.time() - t0 < 5
        writer.close()
        await _still_healthy(srv)
    assert registry.get_sample_value("sidecar_http_requests_total", {"handler": "metrics", "code": "408"}) == 1.0


async def _busy(srv: HttpServer, n: int) -> list[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    """Connections with a request in progress: headers sent, the announced body never comes."""
    out = []
    for _ in range(n):
        reader, writer = await asyncio.open_connection("127.0.0.1", srv.port)
        writer.write(b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n")
        await writer.drain()
        out.append((reader, writer))
    return out


async def test_idle_connections_make_room_and_busy_ones_past_the_limit_get_503(registry: CollectorRegistry) -> None:
    config = HttpConfig(host="127.0.0.1", port=0, max_request_bytes=LIMIT, max_connections=8)
    async with HttpServer(config, registry, []) as srv:
        # Eight connections that never send a request hold every slot: the oldest makes room.
        idle = [await asyncio.open_connection("127.0.0.1", srv.port) for _ in range(8)]
        await asyncio.sleep(0.05)
        raw = await _raw(srv, b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert _status(raw) == 200
        async with asyncio.timeout(5):
            assert await idle[0][0].read() == b""  # the oldest idle connection was closed
        assert not registry.get_sample_value("sidecar_http_connections_refused_total")
        # Eight requests in progress (bodies that never arrive) cannot be closed: one more is refused.
        busy = await _busy(srv, 8)
        await asyncio.sleep(0.2)
        raw = await _raw(srv, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n", read_timeout=5.0)
        assert _status(raw) == 503
        assert registry.get_sample_value("sidecar_http_connections_refused_total") == 1.0
        for _, w in idle + busy:
            w.close()
        async with asyncio.timeout(10):
            while True:  # the server sees the closes on its next loop turns
                await asyncio.sleep(0.05)
                raw = await _raw(srv, b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                if _status(raw) == 200:
                    break


async def test_by_default_only_the_pipeline_gates_readiness(registry: CollectorRegistry) -> None:
    """A vLLM or alert-sink outage pauses work; it must not mark every replica unready (rollouts and
    `helm --wait` would stall). It is shown, not gating."""
    kafka, vllm = Flag("kafka"), Flag("vllm", ready=False, detail="connection refused")
    async with HttpServer(_config(), registry, [kafka, vllm]) as srv, aiohttp.ClientSession() as s:
        async with s.get(_url(srv, "/readyz")) as r:
            assert r.status == 200
            body = await r.json()
        assert body["checks"][1] == {"name": "vllm", "ready": False, "gates": False, "detail": "connection refused"}
        kafka.ready = False
        async with s.get(_url(srv, "/readyz")) as r:
            assert r.status == 503
