"""Safe by default: with no configuration the sidecar binds 0.0.0.0 with no credentials, and the
conversation-derived routes are then not served; they are on loopback, with credentials, or when
``http.operator.allow_unauthenticated`` says so. Each open or withheld listener warns once at
start and is listed on ``/readyz``."""

from __future__ import annotations

import hashlib
from typing import Any

import aiohttp
import pytest
from prometheus_client import CollectorRegistry
from pydantic import ValidationError
from structlog.testing import capture_logs

from sidecar.telemetry.config import HttpConfig
from sidecar.telemetry.http import HttpServer, Page, PageRoute

TOKEN = "operator-token"


def _server(settings: dict[str, Any]) -> HttpServer:
    config = HttpConfig.model_validate({"port": 0, **settings})
    pages = {"escalations": PageRoute(lambda _: Page("<p>conversation text</p>"))}
    return HttpServer(
        config, CollectorRegistry(), [], {"clusters": lambda: {"goal": "a user's goal"}}, page_routes=pages
    )


async def _get(port: int, path: str, headers: dict[str, str] | None = None) -> tuple[int, str]:
    async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{port}{path}", headers=headers) as r:
        return r.status, await r.text()


async def _readyz_check(port: int) -> dict[str, Any] | None:
    async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{port}/readyz") as r:
        checks = (await r.json())["checks"]
    found = [c for c in checks if c["name"] == "conversation-data"]
    return found[0] if found else None


async def test_the_default_bind_withholds_conversation_data() -> None:
    assert HttpConfig().host == "0.0.0.0"
    with capture_logs() as logs:
        async with _server({}) as srv:
            assert (await _get(srv.port, "/escalations"))[0] == 404
            assert (await _get(srv.port, "/clusters"))[0] == 404
            assert (await _get(srv.port, "/healthz"))[0] == 200
            assert (await _get(srv.port, "/metrics"))[0] == 200
            check = await _readyz_check(srv.port)
    assert check is not None and check["ready"] and "withheld" in check["detail"]
    warnings = [e for e in logs if e["event"] == "http.conversation_data_withheld"]
    assert len(warnings) == 1 and warnings[0]["log_level"] == "warning"


async def test_loopback_serves_them_without_a_warning() -> None:
    with capture_logs() as logs:
        async with _server({"host": "127.0.0.1"}) as srv:
            assert (await _get(srv.port, "/escalations"))[0] == 200
            assert (await _get(srv.port, "/clusters"))[0] == 200
            assert await _readyz_check(srv.port) is None
    assert not [e for e in logs if e["event"].startswith("http.conversation_data")]


async def test_allow_unauthenticated_serves_them_with_a_warning_and_a_readyz_line() -> None:
    with capture_logs() as logs:
        async with _server({"operator": {"allow_unauthenticated": True}}) as srv:
            assert (await _get(srv.port, "/escalations"))[0] == 200
            check = await _readyz_check(srv.port)
    assert check is not None and "WITHOUT authentication" in check["detail"]
    assert len([e for e in logs if e["event"] == "http.conversation_data_unauthenticated"]) == 1


async def test_an_operator_listener_with_a_token_serves_them_on_any_address() -> None:
    digest = hashlib.sha256(TOKEN.encode()).hexdigest()
    with capture_logs() as logs:
        async with _server({"operator": {"port": 0, "host": "0.0.0.0", "bearer_token_sha256": [digest]}}) as srv:
            port = srv.ports["operator"]
            assert (await _get(port, "/escalations"))[0] == 401
            assert (await _get(port, "/escalations", {"Authorization": f"Bearer {TOKEN}"}))[0] == 200
            assert await _readyz_check(srv.ports["scrape"]) is None
    assert not [e for e in logs if e["event"].startswith("http.conversation_data")]


def test_the_scrape_listener_has_no_such_switch() -> None:
    with pytest.raises(ValidationError, match=r"http\.operator\.allow_unauthenticated"):
        HttpConfig.model_validate({"scrape": {"allow_unauthenticated": True}})
