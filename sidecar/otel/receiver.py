"""Door one: an OTLP/HTTP receiver, ``POST /v1/traces`` and ``POST /v1/logs``.

``/v1/logs`` takes the GenAI content events that instrumentations in event mode send as log
records (:mod:`sidecar.otel.logs`), with the same limits (a log record counts as a span against
``max_spans_per_request``), authentication, TLS and Kafka acknowledgement as ``/v1/traces``.

A request is answered 200 only once every event derived from it is acknowledged by Kafka
(``acks=all``); until then the exporter holds the batch, so its own retry is the delivery guarantee.
Answers (OTLP/HTTP's own rules: 4xx are not retried by exporters, 503 is, after ``Retry-After``):

* 200 with an ``ExportTraceServiceResponse`` (``ExportLogsServiceResponse``); refused spans and log
  records are reported in ``partial_success``;
* 400 a payload that cannot be decoded, 401 a missing or wrong bearer token, 413 a body over
  ``max_body_bytes`` (as sent) or ``max_decompressed_bytes`` (after gzip) or with more than
  ``max_spans_per_request`` spans, 415 another content type or encoding;
* 408 and a closed connection for a body not received within ``body_timeout_seconds`` plus its
  length at ``min_body_bytes_per_second``;
* 429 with ``Retry-After`` when decoding and deriving took more than ``max_work_seconds``;
* 503 with ``Retry-After`` when Kafka does not acknowledge in ``produce_timeout_seconds``.

Decompressing, decoding and deriving run in a worker thread (:mod:`sidecar.otel.work`), never on
the event loop: a large request does not stall the other listeners, the probes or the consumer.
"""

from __future__ import annotations

import asyncio
import hmac
import math
from typing import Final, Literal

import structlog
from aiohttp import web
from google.protobuf import json_format
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceResponse
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from sidecar.errors import ConfigError
from sidecar.lifecycle import Health
from sidecar.otel.config import OtlpReceiverConfig
from sidecar.otel.decode import Encoding, decode_logs_request, decode_request, gunzip
from sidecar.otel.errors import OtelRefused
from sidecar.otel.found import Derived
from sidecar.otel.ingest import OtelIngest
from sidecar.otel.metrics import OtelMetrics
from sidecar.otel.producer import KafkaUnavailable, OtelEventProducer
from sidecar.otel.refusals import explain
from sidecar.otel.work import work_for
from sidecar.supervision import Supervised, spawn
from sidecar.telemetry.listener import Listener
from sidecar.telemetry.web_config import WebConfig, load_web_config
from sidecar.telemetry.web_safety import extra_headers, security_headers

log = structlog.get_logger(__name__)

DOOR: Final = "receiver"
PATH: Final = "/v1/traces"
LOGS_PATH: Final = "/v1/logs"
Kind = Literal["traces", "logs"]
_CONTENT_TYPES: dict[str, Encoding] = {"application/x-protobuf": "otlp_proto", "application/json": "otlp_json"}
# A refused payload's status by reason (any other reason: 400); 429 and 503 carry Retry-After.
_STATUS: Final = {"oversized": 413, "too_many_spans": 413, "over_budget": 429, "busy": 503}
# How often held spans are checked for their deadline (otel.hold).
HOLD_TICK_SECONDS: Final = 0.25


class OtlpHttpReceiver:
    """The receiver as a component: ``start()`` binds, ``stop()`` closes (idempotent)."""

    def __init__(
        self,
        config: OtlpReceiverConfig,
        ingest: OtelIngest,
        producer: OtelEventProducer,
        metrics: OtelMetrics,
        *,
        events_topic: str,
    ) -> None:
        self._cfg = config
        self._ingest = ingest
        self._producer = producer
        self._metrics = metrics
        self._topic = events_topic
        self._listener: Listener | None = None
        self._holds: Supervised | None = None
        # One request derives and produces at a time: the tracker's state then always describes
        # what was acknowledged or forgotten, and per-conversation order is kept on the events topic.
        self._serial = asyncio.Lock()
        # Admitted and not yet answered: bounded (max_requests_in_flight, max_pending_bytes).
        self._in_flight = 0
        self._pending_bytes = 0
        # Read now: a bad web-config file stops the process before anything is served.
        self._web = WebConfig() if config.web_config_file is None else load_web_config(config.web_config_file)
        if self._web.users:
            raise ConfigError(
                f"{config.web_config_file}: basic_auth_users are not used by the OTLP receiver; "
                "authenticate exporters with otel.receiver.bearer_token"
            )

    @property
    def port(self) -> int:
        if self._listener is None:
            raise RuntimeError("OtlpHttpReceiver is not started")
        return self._listener.port

    async def start(self) -> None:
        if self._listener is not None:
            return
        app = web.Application(client_max_size=self._cfg.max_body_bytes)
        app.router.add_post(PATH, self._handle)
        app.router.add_post(LOGS_PATH, self._handle_logs)
        app.on_response_prepare.append(security_headers)
        if self._web.headers:
            app.on_response_prepare.append(extra_headers(self._web.headers))
        listener = Listener(
            "otlp",
            app,
            self._cfg.host,
            self._cfg.port,
            max_connections=self._cfg.max_connections,
            keepalive_timeout_seconds=self._cfg.keepalive_timeout_seconds,
            refused=self._metrics.receiver_connections_refused,
            ssl_context=None if self._web.tls is None else self._web.tls.ssl_context(),
            # The body is decompressed here, under max_decompressed_bytes, not by the HTTP parser.
            auto_decompress=False,
        )
        await listener.start()
        self._listener = listener
        self._holds = spawn("otel-receiver-holds", self._decide_held)
        log.info("otel.receiver_started", host=self._cfg.host, port=listener.port, tls=self._web.tls is not None)

    async def stop(self) -> None:
        listener, self._listener = self._listener, None
        holds, self._holds = self._holds, None
        if holds is not None:
            await holds.stop()
        if listener is not None:
            await listener.stop()
            # What is still held is decided now, as if its wait were over: a stop loses nothing
            # that was answered 200 (a crash does; the exporter does not send it again).
            await self._release(math.inf)
            log.info("otel.receiver_stopped")

    async def _decide_held(self) -> None:
        while True:
            await asyncio.sleep(HOLD_TICK_SECONDS)
            if self._ingest.due(DOOR):
                await self._release(None)

    async def _release(self, now: float | None) -> None:
        """Derive and produce the held spans that are due (all of them, ``now=inf``)."""
        if not self._ingest.holding:
            return
        async with self._serial:
            ingest = self._ingest
            derived = await work_for(ingest).run(lambda: ingest.derive([], DOOR, now=now))
            if not derived.records:
                return
            try:
                await self._producer.produce(
                    self._topic, derived.records, timeout_seconds=self._cfg.produce_timeout_seconds
                )
            except KafkaUnavailable as exc:
                ingest.forget(derived.conversations)
                self._metrics.produce_errors.labels(DOOR).inc()
                log.warning("otel.produce_failed", door=DOOR, error=str(exc), events=len(derived.records))
                return
        self._metrics.events.labels(DOOR).inc(len(derived.records))

    def health(self) -> Health:
        listening = self._listener is not None
        return Health("otel-receiver", listening, "listening" if listening else "not started")

    def _answer(self, code: int, text: str, headers: dict[str, str] | None = None) -> web.Response:
        self._metrics.requests.labels(str(code)).inc()
        return web.Response(status=code, text=text, headers=headers)

    def _refused(self, code: int, reason: str, detail: str) -> web.Response:
        self._ingest.refuse_payload(DOOR, reason)
        retry = {"Retry-After": str(self._cfg.retry_after_seconds)} if code in (429, 503) else None
        return self._answer(code, f"{reason}: {detail}", retry)

    def _derive(self, body: bytes, compression: str, encoding: Encoding, kind: Kind) -> Derived:
        """The CPU part of a request; runs in a worker thread (:mod:`sidecar.otel.work`)."""
        limit = self._cfg.max_decompressed_bytes
        if compression == "gzip":
            body = gunzip(body, max_bytes=limit)
        if kind == "logs":
            logs = decode_logs_request(body, encoding, max_bytes=limit, max_records=self._cfg.max_spans_per_request)
            return self._ingest.derive([], DOOR, logs=[logs])
        data = decode_request(body, encoding, max_bytes=limit, max_spans=self._cfg.max_spans_per_request)
        return self._ingest.derive(data, DOOR)

    async def _handle_logs(self, request: web.Request) -> web.Response:
        return await self._handle(request, "logs")

    async def _handle(self, request: web.Request, kind: Kind = "traces") -> web.Response:  # noqa: PLR0911
        token = self._cfg.bearer_token
        if token is not None:
            given = request.headers.get("Authorization", "")
            expected = f"Bearer {token.get_secret_value()}"
            if not hmac.compare_digest(given.encode(), expected.encode()):
                return self._answer(401, "missing or wrong bearer token", {"WWW-Authenticate": "Bearer"})
        encoding = _CONTENT_TYPES.get(request.content_type)
        if encoding is None:
            return self._refused(415, "unsupported_content_type", "use application/x-protobuf or application/json")
        compression = request.headers.get("Content-Encoding", "identity").strip().lower()
        if compression not in ("identity", "gzip", ""):
            return self._refused(415, "unsupported_content_type", "Content-Encoding must be gzip or none")
        if request.content_length is not None and request.content_length > self._cfg.max_body_bytes:
            return self._refused(413, "oversized", f"body over {self._cfg.max_body_bytes} bytes")
        size = self._cfg.max_body_bytes if request.content_length is None else request.content_length
        if self._in_flight >= self._cfg.max_requests_in_flight:
            return self._refused(503, "busy", f"{self._in_flight} requests in flight; retry later")
        if self._pending_bytes + size > self._cfg.max_pending_bytes:
            return self._refused(503, "busy", f"{self._pending_bytes} bytes waiting to be produced; retry later")
        self._in_flight += 1
        self._pending_bytes += size
        try:
            return await self._admitted(request, encoding, compression, kind)
        finally:
            self._in_flight -= 1
            self._pending_bytes -= size

    async def _admitted(self, request: web.Request, encoding: Encoding, compression: str, kind: Kind) -> web.Response:
        # A body must arrive within body_timeout_seconds plus its size at min_body_bytes_per_second.
        size = self._cfg.max_body_bytes if request.content_length is None else request.content_length
        allowed = self._cfg.body_timeout_seconds + size / self._cfg.min_body_bytes_per_second
        try:
            async with asyncio.timeout(allowed):
                body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return self._refused(413, "oversized", f"body over {self._cfg.max_body_bytes} bytes")
        except TimeoutError:
            response = self._refused(408, "too_slow", f"body not received within {allowed:.1f}s")
            response.force_close()
            return response
        async with self._serial:
            try:
                derived = await work_for(self._ingest).run(
                    lambda: self._derive(body, compression, encoding, kind),
                    budget_seconds=self._cfg.max_work_seconds,
                    abandon=lambda late: self._ingest.forget(late.conversations),
                )
            except OtelRefused as exc:
                return self._refused(_STATUS.get(exc.reason, 400), exc.reason, exc.detail)
            try:
                await self._producer.produce(
                    self._topic, derived.records, timeout_seconds=self._cfg.produce_timeout_seconds
                )
            except KafkaUnavailable as exc:
                self._ingest.forget(derived.conversations)
                self._metrics.produce_errors.labels(DOOR).inc()
                log.warning("otel.produce_failed", door=DOOR, error=str(exc), events=len(derived.records))
                return self._answer(
                    503, "events not acknowledged by Kafka", {"Retry-After": str(self._cfg.retry_after_seconds)}
                )
        self._metrics.events.labels(DOOR).inc(len(derived.records))
        return self._success(derived.rejected_spans, derived.refused, encoding, kind)

    def _success(self, rejected: int, reasons: dict[str, int], encoding: Encoding, kind: Kind) -> web.Response:
        response: ExportTraceServiceResponse | ExportLogsServiceResponse
        if kind == "logs":
            response = ExportLogsServiceResponse()
            if rejected:  # a logs request decides the spans its records complete: both kinds are told
                response.partial_success.rejected_log_records = rejected
                response.partial_success.error_message = explain(reasons)
        else:
            response = ExportTraceServiceResponse()
            if rejected:
                response.partial_success.rejected_spans = rejected
                response.partial_success.error_message = explain(reasons)
        self._metrics.requests.labels("200").inc()
        if encoding == "otlp_json":
            return web.Response(
                status=200, text=json_format.MessageToJson(response, indent=None), content_type="application/json"
            )
        return web.Response(status=200, body=response.SerializeToString(), content_type="application/x-protobuf")
