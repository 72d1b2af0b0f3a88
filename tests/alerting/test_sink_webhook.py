"""The webhook sink against a real HTTP receiver (aiohttp) that verifies Standard Webhooks signatures."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from aiohttp import web
from pydantic import SecretStr
from standardwebhooks import Webhook
from standardwebhooks.webhooks import WebhookVerificationError

from sidecar.alerting.config import WebhookSinkConfig
from sidecar.alerting.sinks.base import AlertDeliveryError, AlertRejected
from sidecar.alerting.sinks.webhook import WebhookAlertSink
from sidecar.tools.ports import free_port
from tests.alerting.alerts import hostile_alert, make_alert

SECRET = "whsec_" + base64.b64encode(b"receiver-and-sidecar-share-this!").decode()


@dataclass
class Receiver:
    """Verifies every request as a real receiver would; answers 400 to a bad signature."""

    secret: str
    status: int = 204
    received: list[tuple[bytes, dict[str, str]]] = field(default_factory=list)
    verified: list[Any] = field(default_factory=list)
    url: str = ""

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        headers = dict(request.headers)
        self.received.append((body, headers))
        try:
            self.verified.append(Webhook(self.secret).verify(body, headers))
        except WebhookVerificationError:
            return web.Response(status=400, text="bad signature")
        return web.Response(status=self.status)


@asynccontextmanager
async def receiving(secret: str = SECRET) -> AsyncIterator[Receiver]:
    receiver = Receiver(secret)
    app = web.Application()
    app.router.add_post("/hook", receiver.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    receiver.url = f"http://127.0.0.1:{port}/hook"
    try:
        yield receiver
    finally:
        await runner.cleanup()


@asynccontextmanager
async def running(
    url: str, secret: str | None = SECRET, transport: httpx.AsyncBaseTransport | None = None
) -> AsyncIterator[WebhookAlertSink]:
    cfg = WebhookSinkConfig(enabled=True, url=url, secret=SecretStr(secret) if secret else None, timeout_seconds=5)
    sink = WebhookAlertSink(cfg, transport=transport)
    await sink.start()
    try:
        yield sink
    finally:
        await sink.stop()


async def test_a_genuine_alert_verifies(validate_payload: Callable[[Any], None]) -> None:
    alert = make_alert(1)
    async with receiving() as receiver, running(receiver.url) as sink:
        await sink.send(alert)
        assert sink.health().ready
    [(body, headers)] = receiver.received
    [payload] = receiver.verified
    validate_payload(payload)
    assert payload == alert.payload()
    assert headers["webhook-id"] == alert.id
    assert headers["webhook-signature"].startswith("v1,")
    assert headers["Content-Type"] == "application/json"
    assert json.loads(body) == payload  # the bytes on the wire are the bytes signed


async def test_a_tampered_body_is_rejected() -> None:
    async with receiving() as receiver, running(receiver.url) as sink:
        await sink.send(make_alert(2))
    [(body, headers)] = receiver.received
    tampered = body.replace(b'"severity":"warning"', b'"severity":"info"')
    assert tampered != body
    with pytest.raises(WebhookVerificationError):
        Webhook(SECRET).verify(tampered, headers)
    with pytest.raises(WebhookVerificationError):  # the same body under another alert's id
        Webhook(SECRET).verify(body, {**headers, "webhook-id": make_alert(3).id})


class _Tamper(httpx.AsyncBaseTransport):
    """Changes one byte of every request body on its way out: a man in the middle."""

    def __init__(self) -> None:
        self._inner = httpx.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        body = bytearray(await request.aread())
        body[-2] ^= 0x01
        forged = httpx.Request(request.method, request.url, headers=request.headers, content=bytes(body))
        return await self._inner.handle_async_request(forged)

    async def aclose(self) -> None:
        await self._inner.aclose()


async def test_the_receiver_refuses_alerts_tampered_in_flight_or_signed_with_another_key() -> None:
    async with receiving() as receiver:
        async with running(receiver.url, transport=_Tamper()) as sink:
            with pytest.raises(AlertRejected, match="HTTP 400"):
                await sink.send(make_alert(4))
        other = "whsec_" + base64.b64encode(b"not the receiver's key").decode()
        async with running(receiver.url, secret=other) as sink:
            with pytest.raises(AlertRejected, match="HTTP 400"):
                await sink.send(make_alert(5))
        assert receiver.verified == []


async def test_a_hostile_alert_is_signed_and_valid(validate_payload: Callable[[Any], None]) -> None:
    async with receiving() as receiver, running(receiver.url) as sink:
        await sink.send(hostile_alert(6))
    [payload] = receiver.verified
    validate_payload(payload)


async def test_without_a_secret_alerts_go_unsigned_with_id_and_timestamp() -> None:
    async with receiving() as receiver, running(receiver.url, secret=None) as sink:
        with pytest.raises(AlertRejected):  # this receiver insists on signatures
            await sink.send(make_alert(7))
    [(_, headers)] = receiver.received
    assert "webhook-signature" not in headers
    assert headers["webhook-id"] == make_alert(7).id
    assert int(headers["webhook-timestamp"]) > 0


@pytest.mark.parametrize(
    ("status", "error"),
    [
        (500, AlertDeliveryError),
        (503, AlertDeliveryError),
        (429, AlertDeliveryError),
        (408, AlertDeliveryError),
        (400, AlertRejected),
        (410, AlertRejected),
    ],
)
async def test_receiver_answers_are_classified(status: int, error: type[Exception]) -> None:
    async with receiving() as receiver, running(receiver.url) as sink:
        receiver.status = status
        with pytest.raises(error, match=f"HTTP {status}"):
            await sink.send(make_alert(8))
        assert sink.health().ready == (status == 400)
        receiver.status = 200
        await sink.send(make_alert(8))  # the same alert, accepted once the receiver is well
        assert sink.health().ready
    assert len(receiver.verified) == 2


async def test_connection_refused_is_retryable() -> None:
    async with running(f"http://127.0.0.1:{free_port()}/hook") as sink:
        with pytest.raises(AlertDeliveryError, match="ConnectError"):
            await sink.send(make_alert(9))
        assert not sink.health().ready
        assert SECRET not in sink.health().detail
