"""The sidecar's own HTTP server: ``/metrics``, ``/healthz``, ``/readyz`` and read-only JSON views.

Two listeners (:meth:`~sidecar.telemetry.config.HttpConfig.bindings`): the *scrape* listener serves
``/metrics``, ``/healthz`` and ``/readyz``; the *operator* listener the JSON and page routes. With no
``http.operator.port`` both sets share the scrape listener (one port). Each listener may have a
web-config file in the exporter-toolkit format (TLS, basic-auth users, extra headers:
:mod:`sidecar.telemetry.web_config`) and bearer tokens; :mod:`sidecar.telemetry.auth` checks the
credentials, and :mod:`sidecar.telemetry.listener` owns the sockets.

* ``GET /metrics``: Prometheus text exposition of the registry given (OpenMetrics when the
  scraper's ``Accept`` asks for it; gzip when ``Accept-Encoding`` allows it).
* ``GET /healthz``: 200 whenever the event loop gets to answer (liveness).
* ``GET /readyz``: 200 iff every *gating* :class:`~sidecar.lifecycle.HealthReporter` reports
  ready, else 503; the JSON body lists each check with ``ready``, ``gates`` and ``detail``. By
  default (``http.readiness: process``) only the core checks gate: the Kafka source, and the
  supervised background tasks (``tasks``: a task that died fails readiness with its name, see
  :mod:`sidecar.supervision`).
* ``GET /<name>`` for each JSON route (``/clusters``...): the callable's result as JSON, sent
  with ``Cache-Control: no-store`` (what these routes show is derived from conversations); to a
  browser (``Accept`` names ``text/html``) the same JSON inside an HTML page, sent as pages are.
* ``GET /`` on the operator listener: the ``index`` page route when one is given (the overview,
  :mod:`sidecar.telemetry.overview`), else 404.
* ``GET /<name>`` and ``GET /<name>/<param>`` for each page route (``/escalations``,
  ``/trees/<alert id>``, ``/pages.css``): an HTML, SVG or CSS :class:`Page`. A path parameter must
  fully match the route's pattern (else 400, and the renderer is never called); pages are sent
  with a Content-Security-Policy that allows no script at all, styles only from this server (no
  inline style) and no framing, and with ``no-store``. A route with an ``audit`` event logs each
  view it answers: who asked (peer address, ``X-Forwarded-For`` and user agent, cut and made
  printable) and the path parameter, never what the page showed.

Every response, whatever its route or status, carries ``X-Content-Type-Options: nosniff`` and
``Referrer-Policy: no-referrer``; every HTML or SVG response (aiohttp's own error pages included)
carries the pages' policy (:mod:`sidecar.telemetry.web_safety`).

Hostile clients are expected: unknown paths get 404, other methods 405, request bodies over
``max_request_bytes`` 413 (before any handler runs), bodies still arriving after
``request_timeout_seconds`` 408, over-long request lines or header floods are refused by the parser
limits (:mod:`sidecar.telemetry.listener`), unparseable bytes get a 400 and a closed connection,
at ``max_connections`` the oldest idle connection is closed to make room for a new one (idle, slow
or hoarded connections cannot lock the probes out) and only when every connection has a request in
progress does one more get a 503 at once (counted in ``sidecar_http_connections_refused_total``),
past ``max_requests_in_flight`` requests in progress one more gets 503 with ``Retry-After`` while
``/healthz`` and ``/readyz`` keep answering (:mod:`sidecar.telemetry.inflight`), and failed
authentications are counted and limited per client address.
"""

from __future__ import annotations

import asyncio
import inspect
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

import structlog
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter
from prometheus_client.exposition import choose_encoder

from sidecar.lifecycle import Health, HealthReporter
from sidecar.supervision import TASKS_CHECK
from sidecar.telemetry.auth import Authenticator, FailureLimiter
from sidecar.telemetry.config import Binding, HttpConfig
from sidecar.telemetry.exposure import (
    Exposure,
    ExposureReport,
    RedactedRegistry,
    exposure,
    goal_names_exposure,
    serves_conversation_labels,
)
from sidecar.telemetry.inflight import IN_FLIGHT, RequestsInFlight, busy
from sidecar.telemetry.listener import Listener
from sidecar.telemetry.web_config import WebConfig, load_web_config
from sidecar.telemetry.web_safety import (
    NO_STORE,
    PAGE_CSP,
    PAGE_HEADERS,
    extra_headers,
    json_text,
    security_headers,
    who_asked,
)
from sidecar.trees.pages import json_page

log = structlog.get_logger()

JsonRoute = Callable[[], object]


@dataclass(frozen=True, slots=True)
class Page:
    """What a page route answers: a text body, its status and its media type."""

    body: str
    status: int = 200
    content_type: Literal["text/html", "image/svg+xml", "text/css"] = "text/html"


@dataclass(frozen=True, slots=True)
class PageRoute:
    """``GET /<name>`` renders ``render(None)`` (unless ``index`` is off); with ``param``,
    ``GET /<name>/<value>`` renders ``render(value)`` for a value that fully matches ``param``.

    With ``audit`` (a structlog event name), every page rendered is logged under that event with
    the status, the path parameter under the field ``param_field``, and who asked; never the body.
    """

    render: Callable[[str | None], Page]
    param: re.Pattern[str] | None = None
    index: bool = True
    audit: str | None = None
    param_field: str = "param"


_BUILTIN: Final = frozenset({"metrics", "healthz", "readyz"})
_INDEX_LABEL: Final = "index"  # the handler label of GET /
_HEALTH_PATHS: Final = ("/healthz", "/readyz")
_AUDIT_FIELDS: Final = frozenset({"event", "status", "client", "forwarded_for", "user_agent"})
# A route name, or a stylesheet's file name (``pages.css``) for the relative links of pages.
_ROUTE_NAME: Final = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}(?:\.css)?$")


class HttpMetrics:
    """Requests served, by handler and status; ``handler`` is one of a closed set of names."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter(
            "sidecar_http_requests_total",
            "HTTP requests answered by the sidecar's telemetry server.",
            ["handler", "code"],
            registry=registry,
        )
        self.refused = Counter(
            "sidecar_http_connections_refused_total",
            "Connections closed at once because max_connections were already open.",
            registry=registry,
        )
        self.auth_failures = Counter(
            "sidecar_http_auth_failures_total",
            "Requests refused for want of valid credentials, by listener (scrape, operator) and reason "
            "(missing, malformed, invalid, rate_limited).",
            ["listener", "reason"],
            registry=registry,
        )


class HttpServer:
    """aiohttp server for the telemetry endpoints; a :class:`~sidecar.lifecycle.Component`."""

    def __init__(
        self,
        config: HttpConfig,
        registry: CollectorRegistry,
        health: Sequence[HealthReporter],
        json_routes: Mapping[str, JsonRoute] | None = None,
        *,
        core_checks: Sequence[str] = ("kafka", TASKS_CHECK),
        page_routes: Mapping[str, PageRoute] | None = None,
        index: PageRoute | None = None,
    ) -> None:
        routes = dict(json_routes or {})
        pages = dict(page_routes or {})
        for kind, names in (("JSON", routes), ("page", pages)):
            for name in names:
                if not _ROUTE_NAME.fullmatch(name) or name in _BUILTIN:
                    raise ValueError(f"invalid {kind} route name {name!r}")
        for name, page in pages.items():
            if page.audit is not None and (not page.param_field.isidentifier() or page.param_field in _AUDIT_FIELDS):
                raise ValueError(f"page route {name!r}: invalid audit field name {page.param_field!r}")
        if routes.keys() & pages.keys():
            raise ValueError(f"routes {sorted(routes.keys() & pages.keys())} are both JSON and page routes")
        self._config = config
        self._core = frozenset(core_checks)
        self._registry = registry
        self._health = tuple(health)
        self._json_routes = routes
        self._page_routes = pages
        self._index = index
        self._metrics = HttpMetrics(registry)
        self._handlers = _BUILTIN | routes.keys() | pages.keys() | ({""} if index is not None else set())
        # Web-config files are read now: a bad file stops the process before anything is served.
        limiter = FailureLimiter(config.auth_max_failures, config.auth_failure_window_seconds)
        self._exposures: list[Exposure] = []
        goal_names = serves_conversation_labels(registry)  # withheld like the operator routes (exposure.py)
        self._plans: list[tuple[Binding, WebConfig, Authenticator]] = []
        for binding in config.bindings():
            web_config = WebConfig() if binding.web_config_file is None else load_web_config(binding.web_config_file)
            auth = Authenticator(
                binding.name,
                users=web_config.users,
                token_sha256=binding.bearer_token_sha256,
                open_paths=_HEALTH_PATHS if binding.scrape_routes and config.health_without_auth else (),
                limiter=limiter,
                failures=self._metrics.auth_failures,
            )
            self._plans.append((binding, web_config, auth))
            guarded = bool(web_config.users or binding.bearer_token_sha256)
            named = goal_names_exposure(config, binding, protected=guarded) if goal_names else None
            self._exposures.extend([named] if named is not None else [])
            if binding.operator_routes and (routes or pages or index is not None):
                protected = bool(web_config.users or binding.bearer_token_sha256)
                allow = config.operator.allow_unauthenticated
                found = exposure(binding.name, binding.host, binding.port, protected=protected, allow=allow)
                if found is not None:
                    self._exposures.append(found)
        if self._exposures:
            self._health += (ExposureReport(self._exposures),)
        withhold = any(e.what == "goal_names" and not e.served for e in self._exposures)
        self._exposition = RedactedRegistry(registry) if withhold else registry
        self._listeners: list[Listener] = []

    @property
    def port(self) -> int:
        """The first listener's bound port (the scrape listener's unless it is off; the real one when
        the configured port is 0). Only valid after start()."""
        if not self._listeners:
            raise RuntimeError("HttpServer is not started")
        return self._listeners[0].port

    @property
    def ports(self) -> dict[str, int]:
        """Each listener's bound port by name (``scrape``, ``operator``); empty before start()."""
        return {listener.name: listener.port for listener in self._listeners}

    async def start(self) -> None:
        """Bind every listener; returns once they listen. Raises OSError if one cannot bind."""
        if self._listeners:
            raise RuntimeError("HttpServer already started")
        for found in self._exposures:
            found.warn()
        try:
            for binding, web_config, auth in self._plans:
                listener = Listener(
                    binding.name,
                    self._app(binding, web_config, auth),
                    binding.host,
                    binding.port,
                    max_connections=self._config.max_connections,
                    keepalive_timeout_seconds=self._config.keepalive_timeout_seconds,
                    refused=self._metrics.refused,
                    ssl_context=None if web_config.tls is None else web_config.tls.ssl_context(),
                )
                self._listeners.append(listener)
                await listener.start()
        except BaseException:
            await self.stop()
            raise

    def _app(self, binding: Binding, web_config: WebConfig, auth: Authenticator) -> web.Application:
        app = web.Application(
            client_max_size=self._config.max_request_bytes, middlewares=[self._guard, auth.middleware]
        )
        app[IN_FLIGHT] = RequestsInFlight(self._config.requests_in_flight_limit)
        app.on_response_prepare.append(security_headers)
        if web_config.headers:
            app.on_response_prepare.append(extra_headers(web_config.headers))
        if binding.scrape_routes:
            app.router.add_get("/metrics", self._metrics_handler)
            app.router.add_get("/healthz", self._healthz)
            app.router.add_get("/readyz", self._readyz)
        withheld = any(e.listener == binding.name and e.what == "routes" and not e.served for e in self._exposures)
        if binding.operator_routes and not withheld:
            for name, fn in self._json_routes.items():
                app.router.add_get(f"/{name}", _browsable(name, self._json_handler(name, fn)))
            if self._index is not None:
                app.router.add_get("/", self._page_handler(_INDEX_LABEL, self._index))
            for name, page in self._page_routes.items():
                handler = self._page_handler(name, page)
                if page.index:
                    app.router.add_get(f"/{name}", handler)
                if page.param is not None:
                    app.router.add_get(f"/{name}/{{param}}", handler)
        return app

    async def stop(self) -> None:
        """Close the listening sockets and open connections. Idempotent; safe without start()."""
        listeners, self._listeners = self._listeners, []
        for listener in listeners:
            await listener.stop()

    async def __aenter__(self) -> HttpServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # --- middleware -------------------------------------------------------------------------

    @web.middleware
    async def _guard(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        # "" is the index (GET / where it is served); "\0" matches no handler.
        index = request.path == "/" and request.match_info.http_exception is None
        name = "" if index else request.path.strip("/") or "\0"
        if name not in self._handlers:
            # A page with a path parameter counts under its route name, never under the value.
            head = name.split("/", 1)[0]
            name = head if head in self._page_routes and self._page_routes[head].param is not None else "\0"
        label = (name or _INDEX_LABEL) if name in self._handlers else "other"
        # The probes are not counted in flight and take no body: they answer at once (inflight.py).
        probe = request.path in _HEALTH_PATHS
        gate = request.app[IN_FLIGHT]
        counted = not probe and gate.try_enter()
        try:
            refusal: web.StreamResponse | None
            if probe:
                refusal = _refuse(413, "the probes take no request body") if request.body_exists else None
            elif not counted:
                refusal = busy()
            else:
                try:
                    async with asyncio.timeout(self._config.request_timeout_seconds):
                        refusal = await self._check_body(request)
                except TimeoutError:
                    refusal = _refuse(408, "request body not received in time")
            response = refusal or await handler(request)
        except web.HTTPException as exc:
            self._metrics.requests.labels(label, str(exc.status)).inc()
            raise
        except Exception:
            self._metrics.requests.labels(label, "500").inc()  # aiohttp answers 500 for it
            raise
        finally:
            if counted:
                gate.leave()
        self._metrics.requests.labels(label, str(response.status)).inc()
        return response

    async def _check_body(self, request: web.Request) -> web.StreamResponse | None:
        """413 for a body over the limit, whether announced by Content-Length or streamed chunked."""
        limit = self._config.max_request_bytes
        if request.content_length is not None and request.content_length > limit:
            return _too_large(limit)
        if request.body_exists:
            # Chunked (no length announced): count what arrives, stop as soon as it passes the limit.
            total = 0
            while chunk := await request.content.readany():
                total += len(chunk)
                if total > limit:
                    return _too_large(limit)
        return None

    # --- handlers ---------------------------------------------------------------------------

    async def _metrics_handler(self, request: web.Request) -> web.Response:
        encoder, content_type = choose_encoder(request.headers.get("Accept", ""))
        response = web.Response(body=encoder(self._exposition))
        response.headers["Content-Type"] = content_type
        if "gzip" in request.headers.get("Accept-Encoding", ""):
            response.enable_compression(web.ContentCoding.gzip)
        return response

    async def _healthz(self, _request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    def _gates(self, name: str) -> bool:
        return self._config.readiness == "dependencies" or name in self._core

    def readiness(self) -> dict[str, Any]:
        """What ``/readyz`` answers: ``ready`` and each check's ``name``, ``ready``, ``gates``, ``detail``."""
        checks = [_safe_health(r) for r in self._health]
        return {
            "ready": all(c.ready for c in checks if self._gates(c.name)),
            "checks": [
                {"name": c.name, "ready": c.ready, "gates": self._gates(c.name), "detail": c.detail} for c in checks
            ],
        }

    async def _readyz(self, _request: web.Request) -> web.Response:
        body = self.readiness()
        return web.json_response(body, status=200 if body["ready"] else 503)

    def _json_handler(self, name: str, fn: JsonRoute) -> Callable[[web.Request], Awaitable[web.Response]]:
        async def handler(_request: web.Request) -> web.Response:
            try:
                result: Any = fn()
                if inspect.isawaitable(result):
                    result = await result
                text = json_text(result)  # invisible characters as \uXXXX escapes
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.exception("http.json_route_failed", route=name, error_type=type(exc).__name__)
                return web.json_response({"error": "internal error"}, status=500)
            response = web.Response(text=text, content_type="application/json")
            # no-store, and the pages' policy: a browser that opens the JSON runs nothing from it.
            response.headers.update({**NO_STORE, "Content-Security-Policy": PAGE_CSP})
            return response

        return handler

    def _page_handler(self, name: str, page: PageRoute) -> Callable[[web.Request], Awaitable[web.Response]]:
        async def handler(request: web.Request) -> web.Response:
            param = request.match_info.get("param")
            if param is not None and (page.param is None or not page.param.fullmatch(param)):
                return _page(Page("invalid path parameter\n", 400), text=True)
            try:
                result = page.render(param)
            except Exception as exc:
                log.exception("http.page_route_failed", route=name, error_type=type(exc).__name__)
                return _page(Page("internal error\n", 500), text=True)
            if page.audit is not None:
                where = {page.param_field: param} if page.param is not None else {}
                log.info(page.audit, status=result.status, **where, **who_asked(request))
            return _page(result)

        return handler


def _browsable(
    name: str, handler: Callable[[web.Request], Awaitable[web.Response]]
) -> Callable[[web.Request], Awaitable[web.Response]]:
    """A JSON route that answers a browser (``Accept`` names ``text/html``) with the same JSON in an
    HTML page linking back to the overview; every other client gets the JSON."""

    async def negotiate(request: web.Request) -> web.Response:
        response = await handler(request)
        response.headers["Vary"] = "Accept"
        if response.status != 200 or "text/html" not in request.headers.get("Accept", ""):
            return response
        page = _page(Page(json_page(name, response.text or "")))
        page.headers["Vary"] = "Accept"
        return page

    return negotiate


def _page(page: Page, *, text: bool = False) -> web.Response:
    content_type = "text/plain" if text else page.content_type
    response = web.Response(text=page.body, status=page.status, content_type=content_type, charset="utf-8")
    response.headers.update(PAGE_HEADERS)
    return response


def _too_large(limit: int) -> web.Response:
    return _refuse(413, f"request body over {limit} bytes")


def _refuse(status: int, error: str) -> web.Response:
    # Close the connection: the unread rest of the body would otherwise be parsed as the next request.
    response = web.json_response({"error": error}, status=status)
    response.force_close()
    return response


def _safe_health(reporter: HealthReporter) -> Health:
    """A reporter that raises is reported not ready, never turned into a 500."""
    name = type(reporter).__name__
    try:
        health = reporter.health()
    except Exception as exc:
        log.warning("http.health_check_failed", reporter=name, error_type=type(exc).__name__)
        return Health(name=name, ready=False, detail=f"health() raised {type(exc).__name__}")
    if not isinstance(health, Health):
        return Health(name=name, ready=False, detail="health() returned a non-Health value")
    return health


__all__ = ["HttpMetrics", "HttpServer", "JsonRoute", "Page", "PageRoute"]
