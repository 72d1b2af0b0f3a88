"""Every operator page in headless Chromium, served by the app's own wiring (``build_hooks`` and the
``HttpServer`` arguments ``run_app`` uses; :mod:`tests.trees.live_app`) after an hour of traffic:
``/``, ``/escalations``, ``/clusters`` and two tree pages load without a console error, carry the
pages' Content-Security-Policy, give screenshots of the right size with content on them, keep hostile
text inert, link back to the overview, and draw trees at a readable size."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from urllib.parse import urljoin, urlparse

import aiohttp
from PIL import Image

from sidecar.contract import TreeBranch
from sidecar.telemetry.web_safety import PAGE_CSP
from tests.alerting.alerts import make_alert
from tests.trees.browser import open_page, png_size
from tests.trees.live_app import Live, escalations, live_app
from tests.trees.test_view import tree_effect

WIDTH, HEIGHT = 1280, 1600


def _ink(path: Path) -> float:
    """Share of pixels that are not (near) white."""
    with Image.open(path) as image:
        grey = image.convert("L").resize((320, 400))
    histogram = grey.histogram()  # 256 counts of grey levels
    return sum(histogram[:235]) / sum(histogram)


def _wide_tree(live: Live) -> str:
    """A tree whose branches are far longer than a window: it must scroll, not shrink."""
    long = "word " * 600
    branches = [TreeBranch(None, 0, long, -0.3, True, None), TreeBranch(0, 2000, long, -2.0, True, None)]
    alert = make_alert(950, summary="very long branches")
    for observe in escalations(live.assembly)._observers:
        observe(alert, tree_effect("c-wide", branches))
    return alert.id


async def test_every_page_in_chromium(tmp_path: Path) -> None:
    live = live_app(hostile=True)
    wide = _wide_tree(live)
    pages = {
        "overview": "/",
        "escalations": "/escalations",
        "clusters": "/clusters",
        "tree": f"/trees/{live.big.id}",
        "hostile": f"/trees/{live.hostile.id}",
        "wide": f"/trees/{wide}",
    }
    async with live.server() as server, aiohttp.ClientSession() as session:
        root = f"http://127.0.0.1:{server.port}"
        headers = {}
        for name, path in pages.items():
            async with session.get(root + path) as response:
                assert response.status == 200, name
                headers[name] = response.headers
        loaded = {
            name: await asyncio.to_thread(open_page, root + path, tmp_path / f"{name}.png", width=WIDTH, height=HEIGHT)
            for name, path in pages.items()
        }
    for name, page in loaded.items():
        assert headers[name]["Content-Security-Policy"] == PAGE_CSP, name
        assert page.console == [], (name, page.console)
        assert png_size(page.screenshot) == (WIDTH, HEIGHT), name
        ink = _ink(page.screenshot)
        assert ink > (0.004 if name == "clusters" else 0.02), (name, ink)  # not a blank page (clusters: short)
        body = page.dom.split("<body", 1)[1]
        assert "<script" not in body, name
        links = {urlparse(urljoin(root + pages[name], h)).path for h in re.findall(r'<a href="([^"]*)"', body)}
        assert "/" in links or name == "overview", (name, links)
    overview = loaded["overview"].dom
    assert overview.count('class="chart"') == 2 and overview.count("<polyline") >= 4
    assert "&lt;script&gt;alert('goal')&lt;/script&gt;" in overview and "\\u202e" in overview  # hostile goal name
    assert 'href="escalations"' in overview and re.search(r'href="trees/[0-9a-f]{32}"', overview)
    assert '"mode": "extractive"' in loaded["clusters"].dom.replace("&quot;", '"')  # the JSON, as text
    hostile = loaded["hostile"].dom
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in hostile and "&lt;script&gt;alert('summary')" in hostile
    # Readable at 100 %: text of 12 px or more, and a drawing as wide as the window's content.
    for name in ("tree", "wide"):
        svg = re.search(r'<svg [^>]*class="rtree"[^>]*>', loaded[name].dom)
        assert svg is not None
        width = int(re.search(r'width="(\d+)"', svg.group()).group(1))  # type: ignore[union-attr]
        assert width >= 1150, (name, width)
        sizes = {int(s) for s in re.findall(r'font-size="(\d+)"', loaded[name].dom)}
        assert sizes and min(sizes) >= 12, (name, sizes)
    wide_width = int(re.search(r'class="rtree" width="(\d+)"', loaded["wide"].dom).group(1))  # type: ignore[union-attr]
    assert wide_width > WIDTH * 2  # scrolls horizontally (inside div.scroll) rather than shrinking
    assert '<div class="scroll">' in loaded["wide"].dom
