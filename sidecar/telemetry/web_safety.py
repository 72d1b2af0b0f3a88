"""The headers that make the sidecar's pages safe to open, and who asked, for audit log lines.

:func:`security_headers` runs on every response of :class:`~sidecar.telemetry.http.HttpServer`
(an aiohttp ``on_response_prepare`` hook, so aiohttp's own 404/405 answers get it too):
``X-Content-Type-Options: nosniff`` and ``Referrer-Policy: no-referrer`` everywhere, and
:data:`PAGE_CSP` on every HTML or SVG document. Page and JSON routes add :data:`NO_STORE`
themselves. :func:`who_asked` gives the fields an audit line logs about the client.
:func:`json_text` is the JSON of the JSON routes, with no invisible character raw in it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final

from aiohttp import web

# Pages use no script at all, inline SVG (which needs no img-src), and one stylesheet served by a
# route of this server: no inline <style> and no style="" attribute, so 'unsafe-inline' is not
# needed. Presentation attributes of SVG (fill, stroke) are not styles and are not governed by
# style-src. 'self' rather than a path so the pages also work under a proxy's path prefix.
PAGE_CSP: Final = "default-src 'none'; style-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
# Sent with every response: no content sniffing (a JSON body that holds "<html>" stays JSON), and
# no page URL (which names an alert id) leaks to another site through Referer.
COMMON_HEADERS: Final = {"X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer"}
# What pages and JSON routes show is derived from conversations: no browser or proxy cache keeps it.
NO_STORE: Final = {"Cache-Control": "no-store"}
PAGE_HEADERS: Final = {"Content-Security-Policy": PAGE_CSP, **COMMON_HEADERS, **NO_STORE}
_DOCUMENT_TYPES: Final = frozenset({"text/html", "image/svg+xml", "application/xhtml+xml"})
# A client's user agent and forwarded-for are logged cut to this many characters.
MAX_LOGGED_HEADER_CHARS: Final = 200


# The Server header names the product only: no interpreter or library version to fingerprint.
SERVER_NAME: Final = "sidecar"
# aiohttp's own answers to bytes that are not HTTP (its parser's 400s): a fixed text, the request never
# echoed, with the headers every other response has.
FRAMEWORK_ERROR_HEADERS: Final = {"Content-Security-Policy": PAGE_CSP, **COMMON_HEADERS, "Server": SERVER_NAME}


async def security_headers(_request: web.Request, response: web.StreamResponse) -> None:
    """Every response, aiohttp's own 404/405 included, gets the common headers; documents the CSP."""
    response.headers["Server"] = SERVER_NAME
    for key, value in COMMON_HEADERS.items():
        response.headers.setdefault(key, value)
    if response.content_type in _DOCUMENT_TYPES:
        response.headers.setdefault("Content-Security-Policy", PAGE_CSP)


def extra_headers(headers: Mapping[str, str]) -> Callable[[web.Request, web.StreamResponse], Awaitable[None]]:
    """The web-config file's ``http_server_config.headers``, on every response that does not set
    its own (a page's stricter Content-Security-Policy is never replaced)."""

    async def add(_request: web.Request, response: web.StreamResponse) -> None:
        for key, value in headers.items():
            response.headers.setdefault(key, value)

    return add


# The characters the pages show as a visible escape (sidecar/trees/svg.py, docs/security.md): controls,
# every format character (soft hyphen, bidi controls, zero-width characters, the tag characters),
# the line and paragraph separators, surrogates, noncharacters and the invisible fillers and
# variation selectors. The same set as the pages', checked over every code point by
# tests/telemetry/test_json_escape.py.
_NONCHARACTERS: Final = "".join(f"{chr(p * 0x10000 + 0xFFFE)}{chr(p * 0x10000 + 0xFFFF)}" for p in range(17))
_INVISIBLE: Final = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\xad\u034f\u0600-\u0605\u061c\u06dd\u070f\u0890\u0891\u08e2"
    "\u115f\u1160\u17b4\u17b5\u180b-\u180f\u200b-\u200f\u2028-\u202e\u2060-\u206f\u3164"
    "\ud800-\udfff\ufdd0-\ufdef\ufe00-\ufe0d\ufeff\uffa0\ufff9-\ufffb"
    "\U000110bd\U000110cd\U00013430-\U0001343f\U0001bca0-\U0001bca3\U0001d173-\U0001d17a"
    "\U000e0000-\U000e007f\U000e0100-\U000e01ef" + re.escape(_NONCHARACTERS) + "]"
)


def _json_escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    code -= 0x10000  # a UTF-16 surrogate pair, as JSON writes a code point above U+FFFF
    return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"


def json_text(value: Any) -> str:
    """``value`` as JSON, other text as is, but every invisible character as a ``\\uXXXX`` escape.

    A JSON parser reads the same strings back; the body itself carries none of these characters
    raw, so a browser or a terminal showing it cannot be made to hide, reorder or break lines.
    json.dumps writes them only inside strings, where an escape means the same character. A lone
    surrogate (which UTF-8 cannot encode) is escaped too, instead of failing the response."""
    return _INVISIBLE.sub(_json_escape, json.dumps(value, ensure_ascii=False, default=str))


def _printable(value: str | None) -> str | None:
    """A client-supplied header as a log field: cut, and every unprintable character as U+FFFD."""
    if value is None:
        return None
    value = value[:MAX_LOGGED_HEADER_CHARS]
    return "".join(c if c.isprintable() else "\ufffd" for c in value)


def who_asked(request: web.Request) -> dict[str, str | None]:
    """Who asked, for an audit log line. ``forwarded_for`` is whatever the client or a proxy in
    front sent; only the peer address (``client``) is the server's own observation."""
    return {
        "client": request.remote,
        "forwarded_for": _printable(request.headers.get("X-Forwarded-For")),
        "user_agent": _printable(request.headers.get("User-Agent")),
    }


__all__ = [
    "COMMON_HEADERS",
    "MAX_LOGGED_HEADER_CHARS",
    "NO_STORE",
    "PAGE_CSP",
    "PAGE_HEADERS",
    "json_text",
    "security_headers",
    "who_asked",
]
