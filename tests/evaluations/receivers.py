"""Receivers the results-out tests run on loopback: a real OTLP/HTTP logs endpoint (aiohttp,
decoding ``ExportLogsServiceRequest`` with opentelemetry-proto) and a JSON endpoint recording what
Langfuse or Phoenix would be sent. Each can be told to fail: a planned status per request, a hang
(the client times out), or a body limit answered with 413."""

from __future__ import annotations

import asyncio
import json
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest, ExportLogsServiceResponse
from opentelemetry.proto.logs.v1.logs_pb2 import LogRecord

HANG = -1


@dataclass
class Received:
    """One accepted log record, decoded: ids as hex, attributes as plain values."""

    trace_id: str
    span_id: str
    event_name: str
    attributes: dict[str, Any]
    service_name: str

    @property
    def uid(self) -> str:
        return str(self.attributes["log.record.uid"])

    def content(self) -> tuple[Any, ...]:
        """What must be identical between a record and its re-sent copy."""
        return (self.trace_id, self.span_id, self.event_name, sorted(self.attributes.items()))


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None


@dataclass
class Receiver:
    """An HTTP server answering ``plan`` (statuses, or HANG) in order, then 200."""

    path: str
    plan: deque[int] = field(default_factory=deque)
    max_body_bytes: int | None = None
    requests: list[tuple[str, dict[str, str], bytes]] = field(default_factory=list)
    answers: list[int] = field(default_factory=list)
    url: str = ""
    _runner: web.AppRunner | None = None
    _closing: asyncio.Event = field(default_factory=asyncio.Event)

    async def start(self) -> None:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"

    async def stop(self) -> None:
        self._closing.set()  # hung requests end now, not after aiohttp's shutdown timeout
        if self._runner is not None:
            await self._runner.cleanup()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        status = self.plan.popleft() if self.plan else 200
        if status == HANG:
            await self._closing.wait()
            return web.Response(status=503)
        if status == 200 and self.max_body_bytes is not None and len(body) > self.max_body_bytes:
            status = 413
        if status == 200 and request.path != self.path and not request.path.startswith(self.path):
            status = 404
        self.answers.append(status)
        if status != 200:
            return web.Response(status=status, text="no")
        self.requests.append((request.path, dict(request.headers), body))
        return self.ok(request.path, body)

    def ok(self, path: str, body: bytes) -> web.Response:
        return web.Response(status=200, text="{}", content_type="application/json")


@dataclass
class OtlpReceiver(Receiver):
    """``POST /v1/logs`` as an OTLP/HTTP receiver: protobuf in, ``ExportLogsServiceResponse`` out."""

    path: str = "/v1/logs"

    def ok(self, path: str, body: bytes) -> web.Response:
        ExportLogsServiceRequest.FromString(body)  # a body that does not decode fails the test loudly
        return web.Response(
            status=200, body=ExportLogsServiceResponse().SerializeToString(), content_type="application/x-protobuf"
        )

    @property
    def endpoint(self) -> str:
        return self.url + self.path

    def records(self) -> list[Received]:
        out: list[Received] = []
        for _, headers, body in self.requests:
            assert headers["Content-Type"] == "application/x-protobuf"
            req = ExportLogsServiceRequest.FromString(body)
            for rl in req.resource_logs:
                service = {kv.key: _value(kv.value) for kv in rl.resource.attributes}["service.name"]
                for sl in rl.scope_logs:
                    out.extend(_received(r, service) for r in sl.log_records)
        return out


def _received(r: LogRecord, service: str) -> Received:
    return Received(
        trace_id=r.trace_id.hex(),
        span_id=r.span_id.hex(),
        event_name=r.event_name,
        attributes={kv.key: _value(kv.value) for kv in r.attributes},
        service_name=service,
    )


def json_bodies(receiver: Receiver) -> list[tuple[str, dict[str, str], Any]]:
    return [(path, headers, json.loads(body)) for path, headers, body in receiver.requests]
