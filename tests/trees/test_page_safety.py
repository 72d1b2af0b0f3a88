"""Pages that are safe to open: the security headers on every route of the sidecar's HTTP server,
hostile alert text rendered as text, the audit line of each tree view, and, in headless Chromium,
payloads that would leave a marker in the page if they ever ran: the marker stays absent.

A control proves the marker check can fail: the same payloads served raw by a plain aiohttp app
(no escaping, no CSP) do leave their markers; served raw through the sidecar's server, the CSP
alone stops them.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from html.parser import HTMLParser
from typing import Any
from urllib.parse import urljoin

import aiohttp
import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry
from structlog.testing import capture_logs

from sidecar.alerting.alert import Alert
from sidecar.contract import Effect, TreeBranch, TreeScored, TurnContext
from sidecar.telemetry.config import HttpConfig
from sidecar.telemetry.http import HttpServer, Page, PageRoute
from sidecar.telemetry.web_safety import MAX_LOGGED_HEADER_CHARS, PAGE_CSP
from sidecar.transcript.model import Message
from sidecar.trees.config import TreeViewConfig
from sidecar.trees.pages import CSS
from sidecar.trees.view import TreeView
from tests.alerting.alerts import make_alert

# Each payload, if it ever ran, marks the document: an attribute data-pwned-N on <html>, or the title.
PAYLOADS = (
    "<script>document.documentElement.setAttribute('data-pwned-1','')</script>",
    "\"><script>document.documentElement.setAttribute('data-pwned-2','')</script>",
    "'><img src=x onerror=\"document.documentElement.setAttribute('data-pwned-3','')\">",
    "<svg onload=\"document.documentElement.setAttribute('data-pwned-4','')\"></svg>",
    "<iframe srcdoc=\"<script>parent.document.documentElement.setAttribute('data-pwned-5','')</script>\"></iframe>",
    "</title></text></svg><script>document.documentElement.setAttribute('data-pwned-6','')</script>",
    "<a href=\"javascript:document.title='PWNED'\">open</a> javascript:document.title='PWNED'",
    '<base href="javascript:/"><meta http-equiv="refresh" content="0;url=javascript:document.title=\'PWNED\'">',
    '<style>body{display:none}</style><link rel=stylesheet href="http://198.51.100.1/x.css">',
)
# The payloads a browser runs on load when nothing stops them (the others need a click).
RUN_ON_LOAD = {"data-pwned-1", "data-pwned-2", "data-pwned-3", "data-pwned-4", "data-pwned-5", "data-pwned-6"}
JUNK = "\x00\x1b[31m\u202eevil\udcff\ud800\x7f\u0085\u2028"
USER = Message("user", "help me")


class Parsed(HTMLParser):
    """Elements, attributes and text of an HTML document, as a browser's tokenizer sees them."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.text: list[str] = []
        self.title = ""
        self._in_title = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))
        self._in_title = tag == "title" and self.title == ""

    def handle_endtag(self, tag: str) -> None:
        self._in_title = False

    def handle_data(self, data: str) -> None:
        self.text.append(data)
        if self._in_title:
            self.title += data

    def markers(self) -> set[str]:
        return {k for _, attrs in self.tags for k in attrs if k.startswith("data-pwned")}


def parse(html: str) -> Parsed:
    parsed = Parsed()
    parsed.feed(html)
    parsed.close()
    return parsed


def hostile_alert(n: int, big: int = 0) -> Alert:
    """An uncertain-turn alert whose every string a page shows carries the payloads."""
    return make_alert(
        n,
        summary=PAYLOADS[0] + JUNK + "s" * big,
        agent=PAYLOADS[1],
        tenant=PAYLOADS[2] + JUNK,
        goal=PAYLOADS[3],
        conversation_id=PAYLOADS[5][:60] + "c" * big,
        details={"rule": PAYLOADS[4], PAYLOADS[6]: 1, "leaves": 3, "threshold": -5.0},
        text={"best_branch": PAYLOADS[7] + "b" * big, "remaining_tasks": PAYLOADS[8] + JUNK},
    )


def hostile_effect(big: int = 0) -> Effect:
    branches = (
        TreeBranch(None, 0, PAYLOADS[0] + PAYLOADS[3] + "r" * big, -0.2, True, None),
        TreeBranch(0, 5, PAYLOADS[5] + JUNK, -1.5, False, "depth"),
        TreeBranch(0, 9, PAYLOADS[6] + PAYLOADS[1], -2.5, True, None),
    )
    ctx = TurnContext("user_message", "c", 1, (USER,), "booking", None, triggered_at_unix=time.time())
    event = TreeScored(3, 2, -0.2, -0.1, 40, "budget" + PAYLOADS[2], PAYLOADS[4], best_branch="x", branches=branches)
    return Effect(ctx, (event,), {"leaves": 3})


@dataclass
class Served:
    root: str
    view: TreeView
    alert: Alert


@pytest.fixture
async def served() -> AsyncIterator[Served]:
    view = TreeView(TreeViewConfig(), include_text=True)
    alert = hostile_alert(1)
    view.observe(alert, hostile_effect())
    view.observe(make_alert(2, kind="conversation_stalled", summary=PAYLOADS[2]), hostile_effect())
    clusters = {"goals": [{"name": PAYLOADS[0], "size": 3}]}
    config = HttpConfig(host="127.0.0.1", port=0)
    server = HttpServer(config, CollectorRegistry(), [], {"clusters": lambda: clusters}, page_routes=view.routes())
    async with server as srv:
        yield Served(f"http://127.0.0.1:{srv.port}", view, alert)


async def fetch(url: str, method: str = "GET", **kw: Any) -> tuple[int, Any, str]:
    async with aiohttp.ClientSession() as s, s.request(method, url, **kw) as r:
        return r.status, r.headers, await r.text(errors="strict")


def csp_directives(header: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for part in header.split(";"):
        name, *values = part.split()
        assert name not in out, f"directive {name} twice"
        out[name] = values
    return out


def test_the_policy_allows_no_script_no_inline_style_and_no_framing() -> None:
    d = csp_directives(PAGE_CSP)
    assert d["default-src"] == ["'none'"]  # script-src, img-src, connect-src... fall back to it
    assert not {"script-src", "script-src-elem", "script-src-attr", "object-src", "img-src"} & d.keys()
    assert d["style-src"] == ["'self'"]
    assert d["frame-ancestors"] == d["base-uri"] == d["form-action"] == ["'none'"]
    assert "unsafe" not in PAGE_CSP and "data:" not in PAGE_CSP and "*" not in PAGE_CSP


ROUTES = [
    # path, method, status, content type, derived from conversations
    ("/escalations", "GET", 200, "text/html", True),
    ("/trees/{id}", "GET", 200, "text/html", True),
    ("/trees/" + "0" * 32, "GET", 404, "text/html", True),
    ("/trees/%3Cscript%3E", "GET", 400, "text/plain", True),
    ("/pages.css", "GET", 200, "text/css", True),
    ("/clusters", "GET", 200, "application/json", True),
    ("/metrics", "GET", 200, "text/plain", False),
    ("/healthz", "GET", 200, "application/json", False),
    ("/readyz", "GET", 200, "application/json", False),
    ("/nope", "GET", 404, "text/plain", False),
    ("/escalations", "POST", 405, "text/plain", False),
]


@pytest.mark.parametrize(("path", "method", "status", "content_type", "conversational"), ROUTES)
async def test_security_headers_on_every_route(
    served: Served, path: str, method: str, status: int, content_type: str, conversational: bool
) -> None:
    got, headers, _ = await fetch(served.root + path.format(id=served.alert.id), method)
    assert got == status and headers["Content-Type"].split(";")[0] == content_type
    assert headers["X-Content-Type-Options"] == "nosniff"
    assert headers["Referrer-Policy"] == "no-referrer"
    if conversational:
        assert headers["Cache-Control"] == "no-store"
    if conversational and content_type != "application/json":  # every answer of a page route
        assert headers["Content-Security-Policy"] == PAGE_CSP


@pytest.mark.parametrize("path", ["/escalations", "/trees/{id}", "/trees/" + "0" * 32])
async def test_pages_hold_no_script_no_inline_style_and_only_known_links(served: Served, path: str) -> None:
    url = served.root + path.format(id=served.alert.id)
    _, _, body = await fetch(url)
    page = parse(body)
    forbidden = {"script", "style", "iframe", "object", "embed", "base", "img", "form", "foreignobject"}
    assert not {t for t, _ in page.tags} & forbidden
    for tag, attrs in page.tags:
        assert "style" not in attrs and not any(k.startswith("on") for k in attrs), (tag, attrs)
        assert not any("javascript:" in (v or "").lower() for v in attrs.values()), (tag, attrs)
        if tag == "meta":
            assert set(attrs) <= {"charset", "name", "content"} and "http-equiv" not in attrs
        if tag in ("a", "link"):
            href = attrs["href"] or ""
            known = ("./", "../", "escalations", "../escalations", "../pages.css", "pages.css")
            assert href in known or href == f"trees/{served.alert.id}"
    [stylesheet] = [urljoin(url, a["href"] or "") for t, a in page.tags if t == "link"]
    status, headers, css = await fetch(stylesheet)
    assert status == 200 and headers["Content-Type"].startswith("text/css") and css == CSS


async def test_hostile_alert_text_is_rendered_as_text(served: Served) -> None:
    shown = []
    for path in ("/escalations", f"/trees/{served.alert.id}"):
        _, _, body = await fetch(served.root + path)
        # Strict UTF-8 (fetch decodes strictly), no raw control, surrogate or bidi character.
        assert not any((ord(c) < 32 and c not in "\n\t") or 0x7F <= ord(c) <= 0x9F for c in body)
        assert "\u202e" not in body and "\\u202e" in body and "\\u0000" in body and "\\udcff" in body
        parsed = parse(body)
        assert parsed.markers() == set()
        shown.append("".join(parsed.text))
    for payload in PAYLOADS:
        assert any(payload in text for text in shown), f"payload not shown as text: {payload!r}"


async def test_very_long_alert_strings_give_a_bounded_page() -> None:
    view = TreeView(TreeViewConfig(), include_text=True)
    alert = hostile_alert(3, big=2_000_000)
    view.observe(alert, hostile_effect(big=2_000_000))
    escalations = view.escalations_page(None).body
    tree = view.tree_page(alert.id).body
    assert len(escalations.encode()) < 50_000 and len(tree.encode()) < 200_000
    assert parse(tree).markers() == parse(escalations).markers() == set()


async def test_each_tree_view_is_logged_without_content(served: Served) -> None:
    tree = f"/trees/{served.alert.id}".encode()
    with capture_logs() as logs:
        # Sent raw (an HTTP client refuses such headers): control characters are refused by the
        # parser before any handler; invalid UTF-8 (obs-text) passes and is logged made printable.
        refused = await raw_get(served.root, tree, b"Mozilla/5.0 \x1b[2J\x07")
        assert refused.startswith(b"HTTP/1.0 400 ") and b"text/plain" in refused.split(b"\r\n\r\n")[0]
        answered = await raw_get(served.root, tree, b"Mozilla/5.0 \xff\xfe\xc3" + b"x" * 5000)
        assert answered.startswith(b"HTTP/1.1 200 ")
        await fetch(f"{served.root}/trees/{'0' * 32}", headers={"X-Forwarded-For": "203.0.113.9, 10.0.0.1"})
        await fetch(f"{served.root}/trees/%3Cscript%3E")  # refused before rendering: not a view
        await fetch(f"{served.root}/escalations")
    views = [e for e in logs if e["event"] == "operator.tree_viewed"]
    assert [(v["alert_id"], v["status"]) for v in views] == [(served.alert.id, 200), ("0" * 32, 404)]
    first, second = views
    assert first["client"] == "127.0.0.1" and first["forwarded_for"] is None
    assert len(first["user_agent"]) == MAX_LOGGED_HEADER_CHARS and first["user_agent"].isprintable()
    assert first["user_agent"].startswith("Mozilla/5.0 \ufffd\ufffd\ufffdxxx")
    assert second["forwarded_for"] == "203.0.113.9, 10.0.0.1"
    assert [e["status"] for e in logs if e["event"] == "operator.escalations_viewed"] == [200]
    logged = json.dumps(logs, default=str)
    assert "<script" not in logged and "pwned" not in logged and served.alert.summary[:20] not in logged


async def raw_get(root: str, path: bytes, user_agent: bytes) -> bytes:
    host, port = root.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(b"GET %s HTTP/1.1\r\nHost: x\r\nUser-Agent: %s\r\nConnection: close\r\n\r\n" % (path, user_agent))
        return await reader.read()
    finally:
        writer.close()
        await writer.wait_closed()


def test_an_audit_field_cannot_shadow_who_asked() -> None:
    route = PageRoute(lambda _p: Page("x"), audit="operator.x_viewed", param_field="client")
    with pytest.raises(ValueError, match="invalid audit field"):
        HttpServer(HttpConfig(), CollectorRegistry(), [], page_routes={"x": route})


# --- in a real browser --------------------------------------------------------------------------

RAW = "<!doctype html><html><head><title>raw</title></head><body>" + "".join(PAYLOADS) + "</body></html>"


async def _raw_without_csp(_request: web.Request) -> web.Response:
    return web.Response(text=RAW, content_type="text/html")


async def test_no_payload_runs_in_chromium(served: Served) -> None:
    from tests.trees.browser import dump_dom  # fails, never skips, without Chromium

    # Control 1: served raw, unescaped, without CSP, the payloads do run, so markers are seen.
    app = web.Application()
    app.router.add_get("/raw", _raw_without_csp)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        port = runner.addresses[0][1]
        dom, _ = await asyncio.to_thread(dump_dom, f"http://127.0.0.1:{port}/raw")
    finally:
        await runner.cleanup()
    assert parse(dom).markers() >= RUN_ON_LOAD

    # Control 2: the same raw page through the sidecar's server: the CSP alone stops every one.
    raw_server = HttpServer(
        HttpConfig(host="127.0.0.1", port=0),
        CollectorRegistry(),
        [],
        page_routes={"raw": PageRoute(lambda _p: Page(RAW))},
    )
    async with raw_server as srv:
        dom, console = await asyncio.to_thread(dump_dom, f"http://127.0.0.1:{srv.port}/raw")
    assert parse(dom).markers() == set() and parse(dom).title == "raw"
    assert any("Content Security Policy" in line for line in console), console

    # The real pages for the hostile alert: nothing runs, nothing is refused, the payloads are text.
    for path, title in (("/escalations", "recent escalations"), (f"/trees/{served.alert.id}", "response tree")):
        status, headers, _ = await fetch(served.root + path)
        assert status == 200 and headers["Content-Security-Policy"] == PAGE_CSP
        dom, console = await asyncio.to_thread(dump_dom, served.root + path)
        parsed = parse(dom)
        assert parsed.markers() == set() and parsed.title.startswith(title), (path, parsed.title)
        assert not {t for t, _ in parsed.tags} & {"script", "img", "iframe", "base", "style"}, path
        assert console == [], (path, console)  # nothing was even attempted and refused
        assert PAYLOADS[0] in "".join(parsed.text)
