"""The connection gate reads private aiohttp names (aiohttp has no public API for "this connection
waits for a request"): an aiohttp that renames them fails here instead of silently never closing an
idle connection to make room. That the names mean what the gate takes them to mean is proven by
test_connection_abuse.py (idle, slow and flooded connections closed to make room for the probes)."""

from __future__ import annotations

import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter
from structlog.testing import capture_logs

from sidecar.telemetry import listener
from sidecar.telemetry.listener import PRIVATE_HANDLER_SLOTS, missing_internals


async def _ok(_request: web.BaseRequest) -> web.StreamResponse:
    return web.Response()


async def test_this_aiohttp_has_every_name_the_gate_reads() -> None:
    assert missing_internals(web.Server(_ok)) == []


async def test_a_missing_name_is_reported_and_logged(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(listener, "PRIVATE_HANDLER_SLOTS", (*PRIVATE_HANDLER_SLOTS, "_renamed_in_a_later_aiohttp"))
    assert missing_internals(web.Server(_ok)) == ["RequestHandler._renamed_in_a_later_aiohttp"]
    refused = Counter("refused", "refused", registry=CollectorRegistry())
    gate = listener.Listener("scrape", web.Application(), "127.0.0.1", 0, max_connections=4, refused=refused)
    with capture_logs() as logs:
        await gate.start()
        await gate.stop()
    (warning,) = [e for e in logs if e["event"] == "http.eviction_unavailable"]
    assert warning["missing"] == ["RequestHandler._renamed_in_a_later_aiohttp"]
