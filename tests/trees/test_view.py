"""The live view: the bounded store filled by the escalation stage, served over real sockets."""

from __future__ import annotations

import asyncio
import time
import xml.etree.ElementTree as ET
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from prometheus_client import CollectorRegistry

from sidecar.alerting.alert import alert_id
from sidecar.app import build_hooks
from sidecar.config import SidecarConfig
from sidecar.contract import Effect, TreeBranch, TreeScored, TurnContext
from sidecar.stage.pipeline import OutcomeSink
from sidecar.telemetry.config import HttpConfig
from sidecar.telemetry.http import HttpServer
from sidecar.transcript.model import Message
from sidecar.trees.config import TreeViewConfig
from sidecar.trees.view import TreeView
from tests.alerting.alerts import make_alert
from tests.trees import trees

USER = Message("user", "help me")
SVG = "{http://www.w3.org/2000/svg}"


def tree_effect(cid: str, branches: list[TreeBranch], turn: int = 1, lp: float = -0.5) -> Effect:
    ctx = TurnContext("user_message", cid, turn, (USER,), "booking", None, triggered_at_unix=time.time())
    event = TreeScored(len(branches), 1, lp, lp / 4, 40, None, "base", best_branch="x", branches=tuple(branches))
    return Effect(ctx, (event,), {"leaves": len(branches)})


def view(include_text: bool = True, **cfg: Any) -> TreeView:
    return TreeView(TreeViewConfig.model_validate(cfg), include_text=include_text)


def test_observer_keeps_uncertain_trees_lru_bounded() -> None:
    v = view(max_trees=3, max_escalations=4)
    ids = []
    for n in range(5):
        alert = make_alert(n)
        ids.append(alert.id)
        v.observe(alert, tree_effect(f"c{n}", trees.many_leaves(5, seed=n)))
    assert len(v) == 3 and v.get(ids[0]) is None and v.get(ids[1]) is None
    assert v.get(ids[2]) is not None  # touching it makes it the most recently used
    v.observe(make_alert(9), tree_effect("c9", trees.one_leaf()))
    assert v.get(ids[2]) is not None and v.get(ids[3]) is None
    assert [e.id for e in v.recent()] == [make_alert(9).id, *reversed(ids[2:])]  # newest first, 4 kept


def test_other_alert_kinds_are_listed_without_tree() -> None:
    v = view()
    alert = make_alert(1, kind="conversation_incomplete", text={"remaining_tasks": "pay <b>now</b>"})
    v.observe(alert, tree_effect("c1", trees.one_leaf()))
    assert v.get(alert.id) is None
    [e] = v.recent()
    assert e.text == (("remaining_tasks", "pay <b>now</b>"),)
    v.observe(make_alert(2), Effect(tree_effect("c2", []).ctx, (), {}))  # no TreeScored: nothing kept
    assert len(v) == 0


def test_text_only_when_alerts_may_carry_it() -> None:
    quiet = view(include_text=False)
    alert = make_alert(1, text={"best_branch": "secret plan"})
    quiet.observe(alert, tree_effect("c1", trees.one_leaf("secret plan")))
    stored = quiet.get(alert.id)
    assert stored is not None and not stored.shape.has_text
    assert stored.shape.branches[0].length == len("secret plan")
    assert quiet.recent()[0].text == ()
    page = quiet.tree_page(alert.id)
    assert "secret" not in page.body and "text is not kept" in page.body


@pytest.fixture
async def served() -> AsyncIterator[tuple[TreeView, str]]:
    v = view(max_trees=10)
    config = HttpConfig(host="127.0.0.1", port=0, max_request_bytes=2048, max_connections=8)
    async with HttpServer(config, CollectorRegistry(), [], page_routes=v.routes()) as srv:
        yield v, f"http://127.0.0.1:{srv.port}"


async def test_tree_page_over_http(served: tuple[TreeView, str]) -> None:
    v, root = served
    alert = make_alert(3)
    v.observe(alert, tree_effect("c3", trees.hostile()))
    async with aiohttp.ClientSession() as s, s.get(f"{root}/trees/{alert.id}") as r:
        body = await r.text()
        assert r.status == 200 and r.content_type == "text/html"
        assert "script-src" not in r.headers["Content-Security-Policy"]
        assert "default-src 'none'" in r.headers["Content-Security-Policy"]
        assert r.headers["X-Content-Type-Options"] == "nosniff" and r.headers["Cache-Control"] == "no-store"
    assert "<script" not in body and "\u202e" not in body
    svg = body[body.index("<svg") : body.index("</svg>") + 6]
    root_el = ET.fromstring(svg)
    assert len([c for c in root_el.iter(f"{SVG}circle") if c.get("class") == "leaf"]) == len(trees.hostile())
    async with aiohttp.ClientSession() as s, s.get(f"{root}/escalations") as r:
        listing = await r.text()
        assert r.status == 200 and f'href="trees/{alert.id}"' in listing


@pytest.mark.parametrize(
    ("path", "status"),
    [
        ("/trees/" + "0" * 32, 404),  # well-formed, unknown
        ("/trees/" + "A" * 32, 400),  # upper case is not an alert id
        ("/trees/" + "0" * 31, 400),
        ("/trees/" + "0" * 33, 400),
        ("/trees/%3Cscript%3E", 400),
        ("/trees/..%2F..%2Fetc%2Fpasswd", 400),
        ("/trees", 404),
        ("/trees/" + "0" * 32 + "/x", 404),
    ],
)
async def test_tree_ids_are_validated(served: tuple[TreeView, str], path: str, status: int) -> None:
    _, root = served
    async with aiohttp.ClientSession() as s, s.get(root + path) as r:
        assert r.status == status
        if status == 400:
            assert (await r.text()) == "invalid path parameter\n"


async def test_page_routes_keep_the_server_hardening(served: tuple[TreeView, str]) -> None:
    _, root = served
    async with aiohttp.ClientSession() as s:
        async with s.post(f"{root}/escalations") as r:
            assert r.status == 405
        async with s.get(f"{root}/escalations", data=b"x" * 4096) as r:
            assert r.status == 413


async def test_metrics_label_pages_by_route_not_by_id() -> None:
    v = view()
    registry = CollectorRegistry()
    config = HttpConfig(host="127.0.0.1", port=0)
    async with HttpServer(config, registry, [], page_routes=v.routes()) as srv, aiohttp.ClientSession() as s:
        for suffix in ("0" * 32, "f" * 32, "nope"):
            async with s.get(f"http://127.0.0.1:{srv.port}/trees/{suffix}") as r:
                await r.read()
    assert registry.get_sample_value("sidecar_http_requests_total", {"handler": "trees", "code": "404"}) == 2
    assert registry.get_sample_value("sidecar_http_requests_total", {"handler": "trees", "code": "400"}) == 1


def test_route_names_cannot_collide() -> None:
    v = view()
    with pytest.raises(ValueError, match="both JSON and page"):
        HttpServer(HttpConfig(), CollectorRegistry(), [], {"trees": dict}, page_routes=v.routes())
    with pytest.raises(ValueError, match="invalid page route name"):
        HttpServer(HttpConfig(), CollectorRegistry(), [], page_routes={"metrics": v.routes()["trees"]})


async def test_wired_by_build_hooks_from_escalations() -> None:
    """The app's wiring: the escalation sink feeds the view; alerts link where the view serves."""
    config = SidecarConfig(
        alerting={
            "tree_view_base_url": "http://sidecar:9108",
            "include_text": True,
            "policy": {"uncertainty": {"target_rate": 0.2, "window_trees": 20, "min_trees": 10}},
        },
    )
    assembly = build_hooks(config, CollectorRegistry())
    assert set(assembly.page_routes) == {"trees", "escalations", "pages.css"}
    [escalations] = [s for s in assembly.sinks if getattr(s, "name", "") == "escalations"]
    sink: OutcomeSink = escalations
    for i in range(30):
        result = sink.offer(tree_effect(f"w{i}", trees.one_leaf(), lp=-0.1 - (i % 5) * 0.01))
        if result is not None:
            await asyncio.wait_for(result, 5)
    base = tree_effect("hot", trees.many_leaves(60), lp=-40.0)
    wide = TreeScored(60, 20, -40.0, -2.0, 400, None, "base", "best", tuple(trees.many_leaves(60)))
    hot = Effect(base.ctx, (wide,), base.outcome)
    result = sink.offer(hot)
    if result is not None:
        await asyncio.wait_for(result, 5)
    aid = alert_id(config.kafka.group_id, "hot", 1, "uncertain_turn")
    page = assembly.page_routes["trees"].render(aid)
    assert page.status == 200 and 'data-leaves="60"' in page.body
    listing = assembly.page_routes["escalations"].render(None).body
    assert aid in listing
    off = build_hooks(SidecarConfig(tree_view={"enabled": False}), CollectorRegistry())
    assert off.page_routes == {}
