"""The JSON routes (``/clusters``...) carry no invisible character raw: each is a ``\\uXXXX`` escape.

The pages show these characters as a visible escape (``sidecar/trees/svg.py``); JSON has an escape
of its own that a parser reads back as the same character. Checked over every code point against
the pages' set, and over HTTP with hostile goal names."""

from __future__ import annotations

import json

import aiohttp
from prometheus_client import CollectorRegistry

from sidecar.telemetry.config import HttpConfig
from sidecar.telemetry.http import HttpServer
from sidecar.telemetry.web_safety import json_text
from sidecar.trees.svg import neutralize

HOSTILE = {
    "soft hyphen": "pass\u00adword",
    "line separator": "first\u2028second",
    "paragraph separator": "first\u2029second",
    "tag characters": "goal\U000e0069\U000e0067\U000e006e\U000e006f\U000e0072\U000e0065\U000e007f",
    "bidi override": "\u202eevil\u202c",
    "bidi isolates": "\u2066\u2067\u2068\u2069",
    "zero width": "a\u200bb\u200dc\ufeff",
    "lone surrogate": "x\ud800y",
    "variation selector": "a\U000e0100",
    "controls": "\x00\x1b[31m\x7f\x85",
}


def _raw(text: str) -> set[str]:
    """The characters of ``text`` that the pages would show as an escape."""
    return {c for c in text if neutralize(c) != c and c not in "\t\n\r"}


def test_every_code_point_the_pages_escape_is_escaped_in_json_and_no_other() -> None:
    step = 4096
    for start in range(0, 0x110000, step):
        chunk = "".join(chr(c) for c in range(start, min(start + step, 0x110000)))
        text = json_text({"s": chunk})
        assert not _raw(text), f"raw in JSON near U+{start:04X}"
        # What stays raw in the body is every character the pages also leave raw (bar the
        # quotes, backslash and the controls that JSON always escapes).
        escaped = _raw(chunk)
        kept = {c for c in chunk if c not in escaped and c not in '"\\' and ord(c) >= 0x20}
        assert kept <= set(text), f"escaped more than the pages near U+{start:04X}"
        if not start <= 0xD800 < start + step:  # lone surrogates in a row read back as pairs in any JSON
            assert json.loads(text) == {"s": chunk}


def test_hostile_strings_read_back_unchanged() -> None:
    text = json_text(HOSTILE)
    assert not _raw(text)
    assert json.loads(text) == HOSTILE
    assert "\\u00ad" in text and "\\u2028" in text and "\\u2029" in text and "\\udb40\\udc69" in text


async def test_the_clusters_route_serves_hostile_goal_names_escaped() -> None:
    snapshot = {
        "clusters": [{"id": f"g{i}", "name": name, "label": key} for i, (key, name) in enumerate(HOSTILE.items())]
    }
    config = HttpConfig(host="127.0.0.1", port=0)
    async with (
        HttpServer(config, CollectorRegistry(), [], {"clusters": lambda: snapshot}) as srv,
        aiohttp.ClientSession() as s,
        s.get(f"http://127.0.0.1:{srv.port}/clusters") as r,
    ):
        assert r.status == 200 and r.content_type == "application/json"
        body = await r.read()
    text = body.decode("utf-8")  # valid UTF-8: the lone surrogate is an escape, not a failure
    assert not _raw(text)
    for hidden in ("\u00ad", "\u2028", "\u2029", "\U000e0069", "\u202e", "\u2066"):
        assert hidden.encode() not in body
    assert json.loads(text) == snapshot
