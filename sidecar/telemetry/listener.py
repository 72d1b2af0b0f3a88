"""One listening socket of the HTTP server: an aiohttp application behind a connection gate, with TLS.

:class:`Listener` binds ``host``:``port`` and serves one :class:`aiohttp.web.Application` through
a gate that allows at most ``max_connections`` open connections. When they are all open, the
oldest *idle* one (waiting for a request: a keep-alive connection between requests, one that has
not finished sending its headers, or a TLS handshake not yet done) is closed to make room, so
connections that are held open without a request in progress cannot lock anyone out, the probes
included. Only when every connection has a request in progress does one more get a plain 503 and
is closed at once, costing one write and never a parser or a task (counted in ``refused``).

With an :class:`ssl.SSLContext`, every accepted TCP connection is counted from the moment it is
accepted, through the handshake, until the socket closes. asyncio's own ``create_server(ssl=...)``
would not do: it builds the application protocol before the handshake and never tells it about a
handshake that failed, so a gate counting application protocols would leak one slot per failed
handshake and a client could lock the listener out by failing ``max_connections`` handshakes. The
gate here wraps asyncio's TLS protocol instead and releases the slot when the TCP connection is lost,
whatever the handshake did. A handshake not finished within :data:`TLS_HANDSHAKE_SECONDS` is
dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from asyncio import sslproto
from http import HTTPStatus
from typing import Any, Final

import structlog
from aiohttp import web
from prometheus_client import Counter

from sidecar.telemetry.web_safety import FRAMEWORK_ERROR_HEADERS

log = structlog.get_logger()

# Parser limits. A scraper or probe sends a short request line and a handful of small headers;
# these leave ample room for proxies' extra headers while bounding what one connection can make
# the server buffer (request line + headers <= 64 x 8 KiB).
MAX_LINE_BYTES: Final = 8190
MAX_FIELD_BYTES: Final = 8190
MAX_HEADERS: Final = 64
# The default of ``keepalive_timeout_seconds`` (``http.keepalive_timeout_seconds``,
# ``otel.receiver.keepalive_timeout_seconds``). Idle connections are closed after this long,
# including ones that never finish sending a request (aiohttp applies it before the first request
# too, which bounds slow-header clients). Prometheus
# scrapes every 15-60 s and reconnects cheaply, so holding sockets longer only helps a client
# that hoards connections.
KEEPALIVE_TIMEOUT_SECONDS: Final = 15.0
# After refusing a request whose body was not read (413), aiohttp drains the socket for up to this
# long before closing so the client sees the response instead of a reset. aiohttp's 10 s default
# lets a client that announced a huge body pin a connection for that long; 1 s is plenty on
# loopback and cluster networks.
LINGERING_SECONDS: Final = 1.0
# A TLS handshake takes a few round trips; asyncio's 60 s default lets a client that never speaks
# hold a connection slot for a minute. 10 s is ample across a cluster or a slow VPN.
TLS_HANDSHAKE_SECONDS: Final = 10

_BUSY_BODY: Final = b"too many open connections\n"
_BUSY: Final = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\nRetry-After: 1\r\n"
    b"Connection: close\r\nContent-Length: " + str(len(_BUSY_BODY)).encode() + b"\r\n\r\n" + _BUSY_BODY
)


class _Refusal(asyncio.Protocol):
    """Answers 503 and closes: the connection costs one write, never a parser or a task."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.WriteTransport)
        transport.write(_BUSY)
        transport.close()


class _Drop(asyncio.Protocol):
    """Closes the connection at once, unanswered."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.close()


class _CountedTls(sslproto.SSLProtocol):
    """asyncio's server-side TLS protocol that releases its gate slot when the TCP connection ends."""

    def __init__(self, app: web.RequestHandler, context: ssl.SSLContext, gate: _ConnectionGate) -> None:
        # No waiter: nothing awaits the handshake here (asyncio's SSLProtocol accepts None, its stub
        # does not say so); its end is seen in connection_made/connection_lost.
        super().__init__(
            asyncio.get_running_loop(),
            app,
            context,
            None,  # type: ignore[arg-type]
            server_side=True,
            ssl_handshake_timeout=TLS_HANDSHAKE_SECONDS,
        )
        self.handler = app
        self._gate: _ConnectionGate | None = gate

    def connection_lost(self, exc: BaseException | None) -> None:
        try:
            super().connection_lost(exc)
        finally:
            gate, self._gate = self._gate, None
            if gate is not None:
                gate.release(self)

    def evict(self) -> None:
        transport = getattr(self, "_transport", None)  # the TCP transport under the TLS one
        if transport is not None:
            transport.abort()


class _QuietHandler(web.RequestHandler):
    """aiohttp's connection handler, answering its parser's errors (bytes that are not HTTP, a bad
    header) with a fixed text and the usual security headers: the request is never echoed, no
    version banner is sent, and each is logged at debug, not as an error with a traceback."""

    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        del message  # the parser's text quotes the request: never sent back
        if status >= HTTPStatus.INTERNAL_SERVER_ERROR:
            log.error("http.internal_error", status=status, error=type(exc).__name__ if exc else None)
        else:
            log.debug("http.bad_request", status=status, error=type(exc).__name__ if exc else None)
        if request.writer.output_size > 0:
            raise ConnectionError("a response was already sent: the connection is closed")
        phrase = HTTPStatus(status).phrase if status in HTTPStatus._value2member_map_ else "Error"
        response = web.Response(status=status, text=f"{status} {phrase}\n", headers=FRAMEWORK_ERROR_HEADERS)
        response.force_close()
        return response


# aiohttp (3.9 to 3.14 at least) has no public API for either thing the gate needs: to know that a
# connection waits for a request (the handler's message waiter and in-progress flag), and to have
# its server build a handler of another class (the server's loop and handler settings). These are
# the private names read; tests/telemetry/test_listener_internals.py fails on a version without
# them, and a start on such a version logs http.eviction_unavailable (connections are then never
# closed to make room: past max_connections new ones get 503).
PRIVATE_HANDLER_SLOTS: Final = ("_waiter", "_request_in_progress")
PRIVATE_SERVER_ATTRIBUTES: Final = ("_loop", "_kwargs")


def missing_internals(server: web.Server) -> list[str]:
    """The private aiohttp names the gate reads that this aiohttp does not have."""
    slots = set(getattr(web.RequestHandler, "__slots__", ()))
    missing = [f"RequestHandler.{n}" for n in PRIVATE_HANDLER_SLOTS if n not in slots]
    return missing + [f"Server.{n}" for n in PRIVATE_SERVER_ATTRIBUTES if not hasattr(server, n)]


def _handler(server: web.Server) -> web.RequestHandler:
    """A :class:`_QuietHandler` made as ``server()`` makes its own (aiohttp's server keeps the
    handler's settings in ``_kwargs``)."""
    return _QuietHandler(server, loop=server._loop, **server._kwargs)


def _idle(handler: web.RequestHandler) -> bool:
    """Waiting for a request (or never connected: a TLS handshake not done): safe to close.

    Reads aiohttp's own state of the connection (its message waiter and in-progress flag)."""
    if handler.transport is None:
        return True
    waiter = getattr(handler, "_waiter", None)
    return waiter is not None and not waiter.done() and not getattr(handler, "_request_in_progress", True)


class _ConnectionGate:
    """Protocol factory in front of aiohttp's server: at most ``limit`` connections open at once;
    the oldest idle one makes room for a new one."""

    def __init__(self, server: web.Server, limit: int, refused: Counter, context: ssl.SSLContext | None) -> None:
        self._server = server
        self._limit = limit
        self._refused = refused
        self._context = context
        # Open connections, oldest first: the aiohttp handler (plain TCP) or the TLS protocol.
        self._open: dict[object, None] = {}
        self._evicted: set[object] = set()
        if context is None:
            # Plain TCP: aiohttp's handler is the connection's protocol and hears of its end.
            forget = server.connection_lost

            def connection_lost(handler: Any, exc: BaseException | None) -> None:
                self.release(handler)
                forget(handler, exc)

            server.connection_lost = connection_lost  # type: ignore[method-assign,assignment]

    @property
    def open(self) -> int:
        return len(self._open)

    def release(self, conn: object) -> None:
        self._open.pop(conn, None)
        self._evicted.discard(conn)

    def _make_room(self) -> bool:
        for conn in self._open:
            if conn in self._evicted:
                continue
            handler = conn.handler if isinstance(conn, _CountedTls) else conn
            if isinstance(handler, web.RequestHandler) and _idle(handler):
                self._evicted.add(conn)
                if isinstance(conn, _CountedTls):
                    conn.evict()
                else:
                    handler.force_close()
                return True
        return False

    def __call__(self) -> asyncio.BaseProtocol:
        if len(self._open) - len(self._evicted) >= self._limit and not self._make_room():
            self._refused.inc()
            # Over TLS a 503 would first cost a handshake: the connection is closed unanswered.
            return _Refusal() if self._context is None else _Drop()
        handler = _handler(self._server)
        conn: object = handler if self._context is None else _CountedTls(handler, self._context, self)
        self._open[conn] = None
        assert isinstance(conn, asyncio.BaseProtocol)
        return conn


class Listener:
    """One socket serving one application; ``start()`` binds, ``stop()`` is idempotent."""

    def __init__(
        self,
        name: str,
        app: web.Application,
        host: str,
        port: int,
        *,
        max_connections: int,
        refused: Counter,
        ssl_context: ssl.SSLContext | None = None,
        auto_decompress: bool = True,
        keepalive_timeout_seconds: float | None = None,
    ) -> None:
        self.name = name
        self._app = app
        self._host = host
        self._requested_port = port
        self._max_connections = max_connections
        self._refused = refused
        self._ssl = ssl_context
        self._auto_decompress = auto_decompress
        self._keepalive = keepalive_timeout_seconds
        self._runner: web.AppRunner | None = None
        self._server: asyncio.Server | None = None
        self._port: int | None = None

    @property
    def port(self) -> int:
        """The bound port (the real one when the configured port is 0). Only valid after start()."""
        if self._port is None:
            raise RuntimeError(f"listener {self.name} is not started")
        return self._port

    async def start(self) -> None:
        """Bind and start serving; returns once the socket listens. Raises OSError if it cannot bind."""
        if self._runner is not None:
            raise RuntimeError(f"listener {self.name} already started")
        runner = web.AppRunner(
            self._app,
            access_log=None,
            handle_signals=False,
            keepalive_timeout=KEEPALIVE_TIMEOUT_SECONDS if self._keepalive is None else self._keepalive,
            lingering_time=LINGERING_SECONDS,
            max_line_size=MAX_LINE_BYTES,
            max_field_size=MAX_FIELD_BYTES,
            max_headers=MAX_HEADERS,
            auto_decompress=self._auto_decompress,
        )
        await runner.setup()
        self._runner = runner
        assert runner.server is not None
        if missing := missing_internals(runner.server):
            log.warning("http.eviction_unavailable", listener=self.name, missing=missing)
        gate = _ConnectionGate(runner.server, self._max_connections, self._refused, self._ssl)
        try:
            self._server = await asyncio.get_running_loop().create_server(
                gate, self._host, self._requested_port, reuse_address=True
            )
        except BaseException:
            await self.stop()
            raise
        self._port = int(self._server.sockets[0].getsockname()[1])
        log.info("http.started", listener=self.name, host=self._host, port=self._port, tls=self._ssl is not None)

    async def stop(self) -> None:
        """Close the listening socket and open connections. Idempotent; safe without start()."""
        runner, self._runner = self._runner, None
        server, self._server = self._server, None
        if runner is None:
            return
        self._port = None
        if server is not None:
            server.close()  # stop accepting; the runner closes the open connections
        await runner.cleanup()
        if server is not None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(1.0):
                    await server.wait_closed()
        log.info("http.stopped", listener=self.name)


__all__ = [
    "KEEPALIVE_TIMEOUT_SECONDS",
    "LINGERING_SECONDS",
    "PRIVATE_HANDLER_SLOTS",
    "PRIVATE_SERVER_ATTRIBUTES",
    "TLS_HANDSHAKE_SECONDS",
    "Listener",
    "missing_internals",
]
