"""Safe by default: with no configuration the sidecar binds 0.0.0.0 with no credentials, and the
conversation-derived routes are then not served; they are on loopback, with credentials, or when
``http.operator.allow_unauthenticated`` says so. Each open or withheld listener warns once at
start and is listed on ``/readyz``. Goal names on ``/metrics`` (``sidecar_goal_info``'s ``name``) follow
the same rule on the scrape listener, with ``http.scrape.allow_unauthenticated``."""

from __future__ import annotations

import hashlib
from typing import Any

import aiohttp
import pytest
from prometheus_client import CollectorRegistry
from structlog.testing import capture_logs

from sidecar.clustering.metrics import ClusteringMetrics
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


# --- goal names on /metrics ---------------------------------------------------------------------

GOAL_NAME = "refund a damaged order\u2028for Ms Example"


def _goals_server(settings: dict[str, Any], registry: CollectorRegistry) -> HttpServer:
    metrics = ClusteringMetrics(registry)  # what the app registers with clustering on
    metrics.goal_info.labels("g1", GOAL_NAME).set(1)
    config = HttpConfig.model_validate({"port": 0, **settings})
    return HttpServer(config, registry, [], {"clusters": lambda: {"goal": GOAL_NAME}})


async def _metrics(port: int, headers: dict[str, str] | None = None) -> str:
    async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{port}/metrics", headers=headers) as r:
        assert r.status == 200
        return await r.text()


def _goal_events(logs: list[dict[str, Any]]) -> list[str]:
    return [e["event"] for e in logs if e["event"].startswith("http.goal_names")]


async def test_the_default_bind_serves_goal_info_without_the_goal_names() -> None:
    registry = CollectorRegistry()
    with capture_logs() as logs:
        async with _goals_server({}, registry) as srv:
            texts = [
                await _metrics(srv.port),
                await _metrics(srv.port, {"Accept": "application/openmetrics-text; version=1.0.0"}),
                await _metrics(srv.port, {"Accept-Encoding": "gzip"}),
            ]
            check = await _readyz_check(srv.port)
    for text in texts:
        assert 'sidecar_goal_info{goal="g1",name=""} 1.0' in text
        assert "refund" not in text
    # The registry itself keeps the name: the other consumers of the registry are not affected.
    assert registry.get_sample_value("sidecar_goal_info", {"goal": "g1", "name": GOAL_NAME}) == 1.0
    assert check is not None and "goal names on /metrics withheld" in check["detail"]
    assert _goal_events(logs) == ["http.goal_names_withheld"]


async def test_loopback_serves_the_goal_names_without_a_warning() -> None:
    with capture_logs() as logs:
        async with _goals_server({"host": "127.0.0.1"}, CollectorRegistry()) as srv:
            assert "refund a damaged order" in await _metrics(srv.port)
            assert await _readyz_check(srv.port) is None
    assert _goal_events(logs) == []


@pytest.mark.parametrize(
    "settings",
    [{"scrape": {"allow_unauthenticated": True}}, {"operator": {"allow_unauthenticated": True}}],
    ids=["scrape-allow", "shared-port-operator-allow"],
)
async def test_allow_unauthenticated_serves_the_goal_names_with_a_warning(settings: dict[str, Any]) -> None:
    with capture_logs() as logs:
        async with _goals_server(settings, CollectorRegistry()) as srv:
            assert "refund a damaged order" in await _metrics(srv.port)
            check = await _readyz_check(srv.port)
    assert check is not None and "goal names on /metrics served WITHOUT authentication" in check["detail"]
    assert _goal_events(logs) == ["http.goal_names_unauthenticated"]


async def test_an_operator_allowance_on_its_own_port_does_not_open_the_scrape_port() -> None:
    settings = {"operator": {"port": 0, "host": "127.0.0.1", "allow_unauthenticated": True}}
    with capture_logs() as logs:
        async with _goals_server(settings, CollectorRegistry()) as srv:
            assert "refund" not in await _metrics(srv.ports["scrape"])
            # The operator routes on loopback are served although /metrics withholds the names.
            assert (await _get(srv.ports["operator"], "/clusters"))[0] == 200
    assert _goal_events(logs) == ["http.goal_names_withheld"]


async def test_a_scrape_token_serves_the_goal_names_to_its_holder() -> None:
    digest = hashlib.sha256(TOKEN.encode()).hexdigest()
    with capture_logs() as logs:
        async with _goals_server({"scrape": {"bearer_token_sha256": [digest]}}, CollectorRegistry()) as srv:
            assert (await _get(srv.port, "/metrics"))[0] == 401
            assert "refund a damaged order" in await _metrics(srv.port, {"Authorization": f"Bearer {TOKEN}"})
    assert _goal_events(logs) == []


async def test_without_clustering_there_is_nothing_to_withhold_and_no_warning() -> None:
    with capture_logs() as logs:
        async with _server({}) as srv:
            assert "sidecar_goal_info" not in (await _get(srv.port, "/metrics"))[1]
    assert _goal_events(logs) == []
