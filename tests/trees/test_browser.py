"""The live pages in a real browser: headless Chromium loads /trees/{id} and /escalations from the
sidecar's HTTP server (so the real headers, CSP included, apply), counts the leaves it drew, takes
screenshots, and sees no console error. A canary page proves that a console error or a CSP
violation would be seen."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

from prometheus_client import CollectorRegistry

from sidecar.telemetry.config import HttpConfig
from sidecar.telemetry.http import HttpServer, Page, PageRoute
from sidecar.trees.config import TreeViewConfig
from sidecar.trees.view import TreeView
from tests.alerting.alerts import make_alert
from tests.trees import trees
from tests.trees.browser import open_page, png_size
from tests.trees.test_view import tree_effect

CANARY = "<!doctype html><html><body><p>canary</p><script>console.error('canary ran')</script></body></html>"


async def test_tree_and_escalation_pages_in_chromium(tmp_path: Path) -> None:
    view = TreeView(TreeViewConfig(), include_text=True)
    big, hostile = make_alert(1), make_alert(2)
    view.observe(big, tree_effect("c1", trees.many_leaves(120)))
    view.observe(hostile, tree_effect("c2", trees.hostile()))
    view.observe(make_alert(3, kind="conversation_stalled", summary="stalled"), tree_effect("c3", []))
    routes = {**view.routes(), "canary": PageRoute(lambda _p: Page(CANARY))}
    async with HttpServer(HttpConfig(host="127.0.0.1", port=0), CollectorRegistry(), [], page_routes=routes) as srv:
        root = f"http://127.0.0.1:{srv.port}"
        loaded = {
            name: await asyncio.to_thread(open_page, root + path, tmp_path / f"{name}.png")
            for name, path in (
                ("big", f"/trees/{big.id}"),
                ("hostile", f"/trees/{hostile.id}"),
                ("escalations", "/escalations"),
                ("canary", "/canary"),
            )
        }
    assert any("Content Security Policy" in line or "canary ran" in line for line in loaded["canary"].console)
    for name in ("big", "hostile", "escalations"):
        assert loaded[name].console == [], (name, loaded[name].console)
        width, height = png_size(loaded[name].screenshot)
        assert (width, height) == (1280, 1600) and loaded[name].screenshot.stat().st_size > 5000
    assert len(re.findall(r'<circle class="leaf"', loaded["big"].dom)) == 120
    assert len(re.findall(r'<circle class="leaf"', loaded["hostile"].dom)) == len(trees.hostile())
    assert "<script" not in loaded["hostile"].dom.split("<body", 1)[1]  # the hostile text stayed text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in loaded["hostile"].dom
    assert loaded["escalations"].dom.count('href="trees/') == 2  # the two uncertain turns, not the stall
