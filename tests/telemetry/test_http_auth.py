"""The scrape and operator listeners over real sockets: basic auth, bearer tokens, the failure limit,
TLS and mutual TLS, with the web-config file the sidecar reads."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import re
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import bcrypt
import pytest
from prometheus_client import CollectorRegistry

from sidecar.telemetry.auth import FailureLimiter
from sidecar.telemetry.config import HttpConfig
from sidecar.telemetry.http import HttpServer, Page, PageRoute
from tests.support.tls import Pki, make_pki

PASSWORD = "correct horse"
HASH = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=4)).decode()
TOKEN = "tool-token-0123456789"
TOKEN_SHA256 = hashlib.sha256(TOKEN.encode()).hexdigest()
ALERT_ID = "0123456789abcdef0123456789abcdef"
OPERATOR_PATHS = ("/clusters", "/escalations", f"/trees/{ALERT_ID}", "/pages.css")
SCRAPE_PATHS = ("/metrics", "/healthz", "/readyz")


def _basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


GOOD = _basic("operator", PASSWORD)


def _pages() -> dict[str, PageRoute]:
    return {
        "escalations": PageRoute(lambda _p: Page("<p>escalations</p>")),
        "trees": PageRoute(lambda p: Page(f"<p>{p}</p>"), param=re.compile("[0-9a-f]{32}"), index=False),
        "pages.css": PageRoute(lambda _p: Page("p {}", content_type="text/css")),
    }


def _web_config(tmp_path: Path, text: str) -> Path:
    path = tmp_path / f"web-{abs(hash(text))}.yml"
    path.write_text(text, encoding="utf-8")
    return path


def _server(http: dict[str, Any], registry: CollectorRegistry | None = None) -> HttpServer:
    config = HttpConfig.model_validate({"host": "127.0.0.1", "port": 0, **http})
    return HttpServer(
        config, registry or CollectorRegistry(), [], {"clusters": lambda: {"clusters": []}}, page_routes=_pages()
    )


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture
async def split(tmp_path: Path) -> AsyncIterator[tuple[HttpServer, CollectorRegistry]]:
    """Scrape listener open; operator listener with a basic-auth user and a bearer token."""
    users = _web_config(tmp_path, f"basic_auth_users:\n  operator: '{HASH}'\n")
    registry = CollectorRegistry()
    operator = {"port": 0, "web_config_file": str(users), "bearer_token_sha256": [TOKEN_SHA256]}
    srv = _server({"operator": operator, "auth_max_failures": 5}, registry)
    async with srv:
        yield srv, registry


def _failures(registry: CollectorRegistry, listener: str, reason: str) -> float:
    value = registry.get_sample_value("sidecar_http_auth_failures_total", {"listener": listener, "reason": reason})
    assert value is not None
    return value


async def _status(url: str, headers: dict[str, str] | None = None, **kwargs: Any) -> aiohttp.ClientResponse:
    async with aiohttp.ClientSession() as s, s.get(url, headers=headers, **kwargs) as r:
        await r.read()
        return r


async def test_each_listener_serves_only_its_routes(split: tuple[HttpServer, CollectorRegistry]) -> None:
    srv, _ = split
    scrape, operator = srv.ports["scrape"], srv.ports["operator"]
    assert scrape != operator
    for path in SCRAPE_PATHS:
        assert (await _status(f"http://127.0.0.1:{scrape}{path}")).status == 200
        assert (await _status(f"http://127.0.0.1:{operator}{path}", GOOD)).status == 404
    for path in OPERATOR_PATHS:
        assert (await _status(f"http://127.0.0.1:{scrape}{path}")).status == 404
        assert (await _status(f"http://127.0.0.1:{operator}{path}", GOOD)).status == 200


async def test_operator_routes_without_credentials_get_401_and_a_challenge(
    split: tuple[HttpServer, CollectorRegistry],
) -> None:
    srv, registry = split
    for path in OPERATOR_PATHS:
        r = await _status(f"http://127.0.0.1:{srv.ports['operator']}{path}")
        assert r.status == 401, path
        assert r.headers.getall("WWW-Authenticate") == ['Basic realm="sidecar"', 'Bearer realm="sidecar"']
        assert r.headers["X-Content-Type-Options"] == "nosniff"
        good = await _status(f"http://127.0.0.1:{srv.ports['operator']}{path}", GOOD)
        assert good.status == 200, path
        token = await _status(f"http://127.0.0.1:{srv.ports['operator']}{path}", {"Authorization": f"Bearer {TOKEN}"})
        assert token.status == 200, path
    assert _failures(registry, "operator", "missing") == len(OPERATOR_PATHS)
    assert _failures(registry, "operator", "invalid") == 0


async def test_wrong_passwords_are_counted_then_rate_limited(split: tuple[HttpServer, CollectorRegistry]) -> None:
    srv, registry = split
    url = f"http://127.0.0.1:{srv.ports['operator']}/escalations"
    statuses = [(await _status(url, _basic("operator", f"guess-{i}"))).status for i in range(5)]
    assert statuses == [401] * 5
    limited = await _status(url, _basic("operator", "guess-5"))
    assert limited.status == 429
    assert 1 <= int(limited.headers["Retry-After"]) <= 60
    # The right password does not help while the address is limited, and costs no bcrypt check.
    assert (await _status(url, GOOD)).status == 429
    assert (await _status(url, {"Authorization": f"Bearer {TOKEN}"})).status == 429
    assert _failures(registry, "operator", "invalid") == 5
    assert _failures(registry, "operator", "rate_limited") == 3
    # The scrape listener (no credentials configured) is not affected.
    assert (await _status(f"http://127.0.0.1:{srv.ports['scrape']}/metrics")).status == 200


@pytest.mark.parametrize(
    ("header", "reason"),
    [
        ("Basic !!!not-base64!!!", "malformed"),
        ("Basic " + base64.b64encode(b"no-colon").decode(), "malformed"),
        ("Basic " + base64.b64encode(b"\xff\xfe:x").decode(), "malformed"),
        ("Digest username=operator", "malformed"),
        ("Bearer", "malformed"),
        ("Bearer wrong-token", "invalid"),
        ("Basic " + base64.b64encode(b"nobody:" + PASSWORD.encode()).decode(), "invalid"),
        ("Basic " + base64.b64encode(b"operator:" + b"x" * 100).decode(), "invalid"),
        ("Basic " + base64.b64encode(b"operator:" + PASSWORD.encode() + b"\x00").decode(), "invalid"),
        ("Basic " + base64.b64encode(b"operator:" + PASSWORD.encode().upper()).decode(), "invalid"),
    ],
)
async def test_malformed_and_hostile_credentials_are_refused(
    split: tuple[HttpServer, CollectorRegistry], header: str, reason: str
) -> None:
    srv, registry = split
    url = f"http://127.0.0.1:{srv.ports['operator']}/clusters"
    r = await _status(url, {"Authorization": header})
    assert r.status == 401
    assert _failures(registry, "operator", reason) == 1
    assert (await _status(url, GOOD)).status == 200


async def test_a_huge_authorization_header_is_refused_by_the_parser(
    split: tuple[HttpServer, CollectorRegistry],
) -> None:
    srv, _ = split
    reader, writer = await asyncio.open_connection("127.0.0.1", srv.ports["operator"])
    writer.write(b"GET /clusters HTTP/1.1\r\nHost: x\r\nAuthorization: Basic " + b"A" * 100_000 + b"\r\n\r\n")
    await writer.drain()
    answer = await asyncio.wait_for(reader.read(), 5)
    writer.close()
    assert answer.split(b"\r\n", 1)[0].endswith(b" 400 Bad Request")
    assert (await _status(f"http://127.0.0.1:{srv.ports['operator']}/clusters", GOOD)).status == 200


async def test_bcrypt_results_are_cached(
    split: tuple[HttpServer, CollectorRegistry], monkeypatch: pytest.MonkeyPatch
) -> None:
    srv, _ = split
    calls: list[bytes] = []
    real = bcrypt.checkpw

    def counting(password: bytes, hashed: bytes) -> bool:
        calls.append(password)
        return real(password, hashed)

    monkeypatch.setattr(bcrypt, "checkpw", counting)
    url = f"http://127.0.0.1:{srv.ports['operator']}/clusters"
    for _ in range(5):
        assert (await _status(url, GOOD)).status == 200
    assert calls == [PASSWORD.encode()]


async def test_health_stays_open_on_a_protected_scrape_listener_unless_switched(tmp_path: Path) -> None:
    users = _web_config(tmp_path, f"basic_auth_users:\n  prometheus: '{HASH}'\n")
    for open_health in (True, False):
        registry = CollectorRegistry()
        srv = _server({"scrape": {"web_config_file": str(users)}, "health_without_auth": open_health}, registry)
        async with srv:
            base = f"http://127.0.0.1:{srv.port}"
            assert (await _status(base + "/metrics")).status == 401
            assert (await _status(base + "/metrics", _basic("prometheus", PASSWORD))).status == 200
            # One port for both sets of routes: the operator routes take the same credentials.
            assert (await _status(base + "/escalations")).status == 401
            assert (await _status(base + "/escalations", _basic("prometheus", PASSWORD))).status == 200
            for path in ("/healthz", "/readyz"):
                assert (await _status(base + path)).status == (200 if open_health else 401)


async def test_tls_listener_with_headers(tmp_path: Path, pki: Pki) -> None:
    web = _web_config(
        tmp_path,
        f"tls_server_config:\n  cert_file: {pki.server_cert}\n  key_file: {pki.server_key}\n"
        f"basic_auth_users:\n  prometheus: '{HASH}'\n"
        "http_server_config:\n  headers:\n    Strict-Transport-Security: max-age=31536000\n",
    )
    async with _server({"scrape": {"web_config_file": str(web)}}) as srv:
        url = f"https://127.0.0.1:{srv.port}/metrics"
        r = await _status(url, _basic("prometheus", PASSWORD), ssl=pki.client_context())
        assert r.status == 200
        assert r.headers["Strict-Transport-Security"] == "max-age=31536000"
        # Plain HTTP to the TLS port gets no HTTP answer.
        with pytest.raises(aiohttp.ClientError):
            await _status(f"http://127.0.0.1:{srv.port}/metrics", _basic("prometheus", PASSWORD))
        # A client that does not trust the server's CA refuses it.
        with pytest.raises(aiohttp.ClientConnectorCertificateError):
            await _status(url, ssl=ssl.create_default_context())


async def test_mutual_tls_refuses_clients_without_a_trusted_certificate(tmp_path: Path, pki: Pki) -> None:
    web = _web_config(
        tmp_path,
        f"tls_server_config:\n  cert_file: {pki.server_cert}\n  key_file: {pki.server_key}\n"
        f"  client_ca_file: {pki.ca}\n",
    )
    registry = CollectorRegistry()
    async with _server({"scrape": {"web_config_file": str(web)}, "max_connections": 4}, registry) as srv:
        url = f"https://127.0.0.1:{srv.port}/healthz"
        assert (await _status(url, ssl=pki.client_context(with_cert=True))).status == 200
        # Twice the connection limit in refused handshakes: none of them may keep a slot.
        for _ in range(4):
            with pytest.raises((aiohttp.ClientError, ssl.SSLError, ConnectionError)):
                await _status(url, ssl=pki.client_context())
            with pytest.raises((aiohttp.ClientError, ssl.SSLError, ConnectionError)):
                await _status(url, ssl=pki.client_context(stranger=True))
        for _ in range(3):
            assert (await _status(url, ssl=pki.client_context(with_cert=True))).status == 200
        refused = registry.get_sample_value("sidecar_http_connections_refused_total")
        assert refused == 0


async def test_tls_connections_that_never_handshake_make_room(tmp_path: Path, pki: Pki) -> None:
    web = _web_config(tmp_path, f"tls_server_config:\n  cert_file: {pki.server_cert}\n  key_file: {pki.server_key}\n")
    registry = CollectorRegistry()
    async with _server({"scrape": {"web_config_file": str(web)}, "max_connections": 2}, registry) as srv:
        # Two clients that never start a handshake hold both slots; the oldest is closed for a third.
        idle = [await asyncio.open_connection("127.0.0.1", srv.port) for _ in range(2)]
        await asyncio.sleep(0.1)
        assert (await _status(f"https://127.0.0.1:{srv.port}/healthz", ssl=pki.client_context())).status == 200
        async with asyncio.timeout(5):
            assert await idle[0][0].read() == b""
        assert not registry.get_sample_value("sidecar_http_connections_refused_total")
        for _, writer in idle:
            writer.close()
        await asyncio.sleep(0.2)
        assert (await _status(f"https://127.0.0.1:{srv.port}/healthz", ssl=pki.client_context())).status == 200


async def test_a_bad_web_config_file_stops_the_server_before_it_binds(tmp_path: Path) -> None:
    from sidecar.errors import ConfigError

    web = _web_config(tmp_path, "basic_auth_users:\n  admin: plaintext\n")
    with pytest.raises(ConfigError, match="not a bcrypt hash"):
        _server({"scrape": {"web_config_file": str(web)}})


def test_failure_limiter_window_and_bounded_memory() -> None:
    now = [0.0]
    limiter = FailureLimiter(3, 10.0, max_clients=100, clock=lambda: now[0])
    assert [limiter.failed("a") for _ in range(3)] == [False, False, True]
    assert limiter.retry_after("a") == 10
    now[0] = 4.5
    assert limiter.retry_after("a") == 6
    assert limiter.retry_after("b") is None
    now[0] = 10.0
    assert limiter.retry_after("a") is None  # the window ended: a fresh start
    assert limiter.failed("a") is False
    for i in range(10_000):  # addresses from a whole subnet
        limiter.failed(f"10.0.{i // 256}.{i % 256}")
    assert len(limiter) == 100
    # The most recent failures are the ones kept.
    limiter.failed("c")
    limiter.failed("c")
    limiter.failed("c")
    assert limiter.retry_after("c") is not None


async def test_operator_routes_can_be_switched_off() -> None:
    async with _server({"operator": {"enabled": False}}) as srv:
        assert srv.ports.keys() == {"scrape"}
        assert (await _status(f"http://127.0.0.1:{srv.port}/metrics")).status == 200
        for path in OPERATOR_PATHS:
            assert (await _status(f"http://127.0.0.1:{srv.port}{path}")).status == 404


async def test_a_second_listener_that_cannot_bind_leaves_nothing_listening() -> None:
    blocker = await asyncio.start_server(lambda _r, _w: None, "127.0.0.1", 0)
    taken = blocker.sockets[0].getsockname()[1]
    try:
        srv = _server({"operator": {"port": taken}})
        with pytest.raises(OSError, match="address already in use"):
            await srv.start()
        assert srv.ports == {}
        await srv.stop()  # idempotent after a failed start
    finally:
        blocker.close()
        await blocker.wait_closed()
    # Started again once the port is free: both listeners come up.
    async with srv:
        assert srv.ports["operator"] == taken


@pytest.mark.parametrize(
    "value", [b"Basic \xc3\xa9\xff\xfe", b"Bearer \xff\xfe\x80", b"Basic " + base64.b64encode(b"\xe9t\xe9:\xff")]
)
async def test_non_ascii_credentials_are_refused_without_harm(
    split: tuple[HttpServer, CollectorRegistry], value: bytes
) -> None:
    srv, _ = split
    reader, writer = await asyncio.open_connection("127.0.0.1", srv.ports["operator"])
    writer.write(b"GET /clusters HTTP/1.1\r\nHost: x\r\nConnection: close\r\nAuthorization: " + value + b"\r\n\r\n")
    await writer.drain()
    answer = await asyncio.wait_for(reader.read(), 5)
    writer.close()
    assert answer.split(b"\r\n", 1)[0].endswith(b" 401 Unauthorized"), answer[:200]
    assert (await _status(f"http://127.0.0.1:{srv.ports['operator']}/clusters", GOOD)).status == 200
