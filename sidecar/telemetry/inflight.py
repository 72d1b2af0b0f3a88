"""Requests in flight on one listener, with capacity the probes never have to share.

Each listener of the HTTP server (scrape, operator) admits at most ``limit`` requests in progress
at once (``http.max_requests_in_flight``, by default half of ``http.max_connections``). One more is
answered ``503`` with ``Retry-After: 1`` before its body is read or its credentials are checked, and
its connection is closed (the unread body would otherwise be parsed as the next request).

``/healthz`` and ``/readyz`` are not counted: their answers need no body and no work beyond reading
the health reporters, so they finish at once. Because the limit is below ``max_connections``, the
requests in progress never hold every connection: the listener's connection gate
(:mod:`sidecar.telemetry.listener`) always finds an idle one to close, or a free slot, for a probe.
"""

from __future__ import annotations

from typing import Final

from aiohttp import web

RETRY_AFTER_SECONDS: Final = 1


class RequestsInFlight:
    """A counter of requests in progress on one listener; ``try_enter`` / ``leave`` around each."""

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError("limit must be at least 1")
        self._limit = limit
        self._current = 0

    @property
    def current(self) -> int:
        return self._current

    def try_enter(self) -> bool:
        if self._current >= self._limit:
            return False
        self._current += 1
        return True

    def leave(self) -> None:
        self._current = max(0, self._current - 1)


def busy() -> web.Response:
    """The answer past the limit: 503, Retry-After, and a closed connection."""
    response = web.json_response(
        {"error": "too many requests in progress"},
        status=503,
        headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
    )
    response.force_close()
    return response


IN_FLIGHT: Final = web.AppKey("requests_in_flight", RequestsInFlight)

__all__ = ["IN_FLIGHT", "RETRY_AFTER_SECONDS", "RequestsInFlight", "busy"]
