"""The overview at ``GET /``: its bounded ring of points fed from the counters, the rates and
totals it computes, its HTML (escaped, no script, no inline style) and its route on the server."""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import re
from html.parser import HTMLParser

import aiohttp
import pytest
from prometheus_client import CollectorRegistry, Gauge

from sidecar.clustering.metrics import ClusteringMetrics
from sidecar.lifecycle import Health
from sidecar.scoring.metrics import ScoringMetrics
from sidecar.telemetry.config import HttpConfig
from sidecar.telemetry.http import HttpServer, Page, PageRoute
from sidecar.telemetry.overview import MAX_POINTS, RATE_WINDOW_SECONDS, Overview
from sidecar.telemetry.web_safety import PAGE_CSP
from sidecar.trees.overview_page import Series, line_chart
from tests.alerting.alerts import hostile_alert, make_alert
from tests.trees.test_view import tree_effect


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


def _overview(**kw: object) -> tuple[Overview, ScoringMetrics, ClusteringMetrics, Clock]:
    registry = CollectorRegistry()
    scoring, clustering = ScoringMetrics(registry), ClusteringMetrics(registry)
    clock = Clock()
    return Overview(registry, clock=clock, **kw), scoring, clustering, clock  # type: ignore[arg-type]


class Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))


def test_the_ring_is_bounded_to_an_hour_of_points() -> None:
    overview, _, _, clock = _overview()
    for _ in range(3 * MAX_POINTS):
        clock.now += 15
        overview.sample()
    points = overview.points()
    assert len(points) == MAX_POINTS and points[-1].at == clock.now
    assert points[0].at == clock.now - 15 * (MAX_POINTS - 1)


def test_completion_rate_counts_the_conversations_of_the_last_five_minutes_per_goal() -> None:
    overview, scoring, _, clock = _overview()
    ended = scoring.conversations_ended
    ended.labels("a", "complete", "g1").inc(9)
    ended.labels("b", "complete", "g1").inc(1)  # summed over agents
    ended.labels("a", "incomplete", "g2").inc(10)
    ended.labels("a", "unscored", "g1").inc(50)  # not judged: no part of any rate
    ended.labels("a", "error", "g2").inc(50)
    clock.now += 15
    overview.sample()
    clock.now += RATE_WINDOW_SECONDS * 2
    overview.sample()
    ended.labels("a", "incomplete", "g1").inc(10)  # later: g1 now 0 % in the window, 50 % overall
    clock.now += 15
    data = overview.data()
    [overall, *per_goal] = data.completion
    assert overall.label == "all conversations"
    rates = [v for _, v in overall.points]
    assert rates[1] == pytest.approx(10 / 20)  # first points: since the start
    assert rates[-1] == pytest.approx(0.0)  # last point: only the 10 incomplete of the last 5 minutes
    g1 = next(s for s in per_goal if s.label == "g1")
    assert g1.points[-1][1] == pytest.approx(0.0)
    goals = {g.id: g for g in data.goals}
    assert goals["g1"].judged == 20 and goals["g1"].completion_rate == pytest.approx(0.5)
    assert goals["g2"].completion_rate == pytest.approx(0.0)


def test_a_window_without_judged_conversations_has_no_rate() -> None:
    overview, _, _, clock = _overview()
    for _ in range(5):
        clock.now += 15
        overview.sample()
    [overall] = overview.data().completion
    assert all(v is None for _, v in overall.points)


def test_goals_have_names_and_sizes_and_at_most_eight_are_plotted() -> None:
    overview, scoring, clustering, _ = _overview()
    for i in range(12):
        clustering.goal_info.labels(f"g{i}", f"goal number {i}").set(1)
        clustering.cluster_size.labels(f"g{i}").set(100 - i)
        scoring.conversations_ended.labels("a", "complete", f"g{i}").inc(i + 1)
    data = overview.data()
    assert [g.id for g in data.goals][:3] == ["g0", "g1", "g2"]  # largest first
    assert data.goals[0].name == "goal number 0" and data.goals[0].size == 100
    assert len(data.completion) == 1 + 8
    assert data.completion[1].label == "goal number 11"  # plotted: the most judged


def test_unknown_and_other_are_worded_and_not_plotted_as_goals() -> None:
    overview, scoring, _, _ = _overview()
    for goal in ("unknown", "other", "g1"):
        scoring.conversations_ended.labels("a", "complete", goal).inc()
    data = overview.data()
    assert [s.label for s in data.completion] == ["all conversations", "g1"]
    names = {g.id: g.name for g in data.goals}
    assert names["unknown"] == "(no goal assigned yet)" and names["other"].startswith("(other goals")


def test_goals_that_share_a_name_are_told_apart_by_id() -> None:
    overview, scoring, clustering, _ = _overview()
    for goal in ("g1", "g2", "g3"):
        clustering.goal_info.labels(goal, "unnamed" if goal != "g3" else "book a table").set(1)
        scoring.conversations_ended.labels("a", "complete", goal).inc()
    labels = sorted(s.label for s in overview.data().completion[1:])
    assert labels == ["book a table", "unnamed (g1)", "unnamed (g2)"]


def test_alerts_are_counted_by_kind_and_the_latest_kept_with_tree_links() -> None:
    kept = set()
    overview, _, _, clock = _overview(has_tree=lambda i: i in kept)
    alerts = [make_alert(i, kind=k) for i, k in enumerate(["uncertain_turn"] * 3 + ["conversation_stalled"] * 20)]
    kept.add(alerts[0].id)
    kept.add(alerts[-1].id)
    for alert in alerts:
        overview.observe(alert, tree_effect(alert.conversation_id, []))
    clock.now += 15
    overview.sample()
    data = overview.data()
    assert data.alert_totals == {"uncertain_turn": 3, "conversation_incomplete": 0, "conversation_stalled": 20}
    assert [s.points[-1][1] for s in data.alerts] == [3.0, 0.0, 20.0]
    assert len(data.recent) == 10 and data.recent[0].id == alerts[-1].id  # newest first, bounded
    assert data.with_tree == {alerts[-1].id}  # the first one's tree is kept, but it is no longer listed
    page = overview.page(None).body
    assert page.count('href="trees/') == 1


def test_hostile_names_and_summaries_stay_text() -> None:
    overview, scoring, clustering, _ = _overview()
    name = "<script>alert(1)</script>\u202e<img src=x onerror=alert(2)>"
    clustering.goal_info.labels("g<1>", name).set(1)
    clustering.cluster_size.labels("g<1>").set(5)
    scoring.conversations_ended.labels("a", "complete", "g<1>").inc()
    overview.observe(hostile_alert(1), tree_effect("c", []))
    overview.bind_readiness(lambda: {"ready": False, "checks": [{"name": "<b>x", "ready": False, "detail": name}]})
    body = overview.page(None).body
    parser = Tags()
    parser.feed(body)
    assert not {t for t, _ in parser.tags} & {"script", "style", "img", "iframe", "object", "base", "form"}
    for tag, attrs in parser.tags:
        assert "style" not in attrs and not any(k.startswith("on") for k in attrs), (tag, attrs)
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in body and "\\u202e" in body and "\u202e" not in body
    assert "not ready" in body


def test_readiness_checks_are_worded() -> None:
    overview, _, _, _ = _overview()
    note = "demo adapter bundled with the repository, trained on a small sample; not validated on your traffic"
    overview.bind_readiness(
        lambda: {
            "ready": True,
            "checks": [
                {"name": "kafka", "ready": True, "gates": True, "detail": "3 partitions"},
                {"name": "completion_adapters", "ready": True, "gates": False, "detail": note},
                "not a mapping",
            ],
        }
    )
    body = overview.page(None).body
    assert "Kafka source" in body and "gates readiness" in body and "shown only, does not gate" in body
    assert note in body


@pytest.mark.parametrize(
    "points",
    [[], [(0.0, None)], [(1.0, math.nan), (2.0, math.inf), (3.0, -1.0)], [(5.0, 0.5)], [(1.0, 1e300), (1.0, 2.0)]],
)
def test_charts_take_any_values(points: list[tuple[float, float | None]]) -> None:
    svg = line_chart([Series("s", points)], y_max=None, title="t")
    assert svg.startswith("<svg") and svg.endswith("</svg>") and "nan" not in svg and "inf" not in svg


async def test_sampler_task_adds_points_and_stops() -> None:
    overview = Overview(CollectorRegistry(), sample_seconds=0.01)
    await overview.start()
    await asyncio.sleep(0.2)
    await overview.stop()
    count = len(overview.points())
    assert count > 3
    await asyncio.sleep(0.05)
    assert len(overview.points()) == count
    await overview.stop()  # idempotent
    with pytest.raises(ValueError, match="positive"):
        Overview(CollectorRegistry(), sample_seconds=0)


class Check:
    def health(self) -> Health:
        return Health("kafka", True, "consuming")


async def _get(url: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], str]:
    async with aiohttp.ClientSession() as session, session.get(url, headers=headers or {}) as r:
        return r.status, dict(r.headers), await r.text()


async def test_the_route_at_root_with_csp_counted_as_index_and_behind_auth() -> None:
    registry = CollectorRegistry()
    overview = Overview(registry)
    token = "overview-token-0123456789"
    config = HttpConfig.model_validate(
        {"host": "127.0.0.1", "port": 0, "operator": {"port": 0, "bearer_token_sha256": [_sha(token)]}}
    )
    server = HttpServer(config, registry, [Check()], index=overview.route())
    overview.bind_readiness(server.readiness)
    async with server:
        op = f"http://127.0.0.1:{server.ports['operator']}"
        status, _, _ = await _get(op + "/")
        assert status == 401
        status, headers, body = await _get(op + "/", {"Authorization": f"Bearer {token}"})
        assert status == 200 and headers["Content-Security-Policy"] == PAGE_CSP
        assert headers["Cache-Control"] == "no-store" and "Kafka source" in body
        status, _, _ = await _get(op + "/nope", {"Authorization": f"Bearer {token}"})
        assert status == 404
        scrape = f"http://127.0.0.1:{server.ports['scrape']}"
        assert (await _get(scrape + "/"))[0] == 404  # the overview is on the operator listener only
    assert registry.get_sample_value("sidecar_http_requests_total", {"handler": "index", "code": "200"}) == 1
    assert registry.get_sample_value("sidecar_http_requests_total", {"handler": "other", "code": "404"}) == 2


async def test_a_json_route_answers_a_browser_with_a_page_and_tools_with_json() -> None:
    hostile = {"name": "<script>alert(1)</script>\u202e", "n": 3}
    server = HttpServer(HttpConfig(host="127.0.0.1", port=0), CollectorRegistry(), [], {"clusters": lambda: hostile})
    async with server:
        url = f"http://127.0.0.1:{server.port}/clusters"
        status, headers, body = await _get(url, {"Accept": "text/html,application/xhtml+xml,*/*;q=0.8"})
        assert status == 200 and headers["Content-Type"].startswith("text/html") and headers["Vary"] == "Accept"
        assert headers["Content-Security-Policy"] == PAGE_CSP and headers["Cache-Control"] == "no-store"
        assert "&lt;script&gt;alert(1)&lt;/script&gt;\\u202e" in body and "<script>" not in body
        assert '<a href="./">overview</a>' in body
        for accept in ("*/*", "application/json", None):
            status, headers, body = await _get(url, {"Accept": accept} if accept else {})
            assert status == 200 and headers["Content-Type"].startswith("application/json"), accept
            assert headers["Vary"] == "Accept"
            assert json.loads(body) == hostile


async def test_without_an_index_root_is_404() -> None:
    routes = {"x": PageRoute(lambda _p: Page("<p>x</p>"))}
    async with HttpServer(HttpConfig(host="127.0.0.1", port=0), CollectorRegistry(), [], page_routes=routes) as srv:
        assert (await _get(f"http://127.0.0.1:{srv.port}/"))[0] == 404


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def test_a_registry_without_goal_metrics_shows_no_goal() -> None:
    # The goal metrics are read by name: a registry without them gives an empty goal list.
    registry = CollectorRegistry()
    Gauge("unrelated", "x", registry=registry).set(1)
    assert Overview(registry).data().goals == []
    assert re.search(r"No goal yet", Overview(registry).page(None).body)
