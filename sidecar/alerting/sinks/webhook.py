"""Alerts as JSON POSTs signed per the Standard Webhooks spec (https://www.standardwebhooks.com).

Each request carries ``webhook-id`` (the alert's stable id: receivers drop a repeat they have
already processed), ``webhook-timestamp`` (seconds since the epoch, fresh on every attempt) and,
with a secret configured, ``webhook-signature`` (``v1,<base64 HMAC-SHA256>`` of
``{id}.{timestamp}.{body}``, computed by the ``standardwebhooks`` package). The body sent is
exactly the bytes signed, so a receiver verifies the raw request body, never a re-serialisation.
"""

from __future__ import annotations

import base64
import binascii
import time
from datetime import UTC, datetime

import httpx
from standardwebhooks import Webhook

from sidecar.alerting.alert import Alert
from sidecar.alerting.config import WebhookSinkConfig
from sidecar.alerting.sinks._common import encode_payload
from sidecar.alerting.sinks._http import HttpDestination
from sidecar.errors import ConfigError
from sidecar.lifecycle import Health


def signer(cfg: WebhookSinkConfig) -> Webhook | None:
    """The signer for ``cfg.secret`` (``whsec_<base64>``); None without a secret.

    Raises :class:`ConfigError` for a secret that is not base64 or decodes to nothing; the
    message never contains the secret.
    """
    if cfg.secret is None:
        return None
    encoded = cfg.secret.get_secret_value().removeprefix("whsec_")
    try:
        # Strictly: the package's own decoding skips characters outside the alphabet, so a mangled
        # secret would sign with a different key than the receiver's without anyone noticing.
        key = base64.b64decode(encoded + "=" * (-len(encoded) % 4), validate=True)
    except binascii.Error:
        key = b""
    if not key:
        raise ConfigError("alerting.sinks.webhook.secret must be whsec_ followed by non-empty base64")
    return Webhook(key)


class WebhookAlertSink:
    """An :class:`~sidecar.alerting.sinks.base.AlertSink` POSTing signed alerts to one URL."""

    name = "webhook"

    def __init__(self, cfg: WebhookSinkConfig, *, transport: httpx.AsyncBaseTransport | None = None) -> None:
        self._signer = signer(cfg)
        self._http = HttpDestination(
            self.name,
            cfg.url,
            timeout_seconds=cfg.timeout_seconds,
            headers={"content-type": "application/json"},
            transport=transport,
        )

    async def start(self) -> None:
        await self._http.start()

    async def stop(self) -> None:
        await self._http.stop()

    def request(self, alert: Alert, now_unix: float) -> tuple[bytes, dict[str, str]]:
        """The body and the Standard Webhooks headers of one delivery attempt at ``now_unix``."""
        data = encode_payload(alert).decode("utf-8")
        timestamp = int(now_unix)
        headers = {"webhook-id": alert.id, "webhook-timestamp": str(timestamp)}
        if self._signer is not None:
            at = datetime.fromtimestamp(timestamp, tz=UTC)
            headers["webhook-signature"] = self._signer.sign(msg_id=alert.id, timestamp=at, data=data)
        return data.encode("utf-8"), headers

    async def send(self, alert: Alert) -> None:
        body, headers = self.request(alert, time.time())
        await self._http.post(body, headers)

    def health(self) -> Health:
        return self._http.health()
