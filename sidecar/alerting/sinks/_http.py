"""One HTTP POST per delivery, its outcome classified once: the part Alertmanager and webhooks share.

Classification (the same for every HTTP sink):

* 2xx: accepted.
* 408, 429, 5xx, timeouts and transport errors (refused, reset, DNS, TLS): :class:`AlertDeliveryError`,
  the destination may take it later.
* every other status (4xx, and a redirect, which is never followed: a signed alert is not re-sent
  to a host the configuration did not name): :class:`AlertRejected`, sending the same request again
  would get the same answer.

The response body is never read: an answer is judged by its status alone, so a hostile or broken
receiver cannot make the sidecar buffer a large body, and nothing it says reaches the logs.
"""

from __future__ import annotations

from collections.abc import Mapping

import httpx

from sidecar.alerting.sinks._common import DestinationHealth
from sidecar.alerting.sinks.base import AlertDeliveryError, AlertRejected
from sidecar.lifecycle import Health

USER_AGENT = "llm-agent-sidecar-alerts/1"
_RETRYABLE_STATUS = frozenset({408, 429})
_THIS_ALERT_REFUSED = frozenset({"HTTP 400", "HTTP 413", "HTTP 422"})


def classify_status(status: int) -> AlertDeliveryError | AlertRejected | None:
    """None when ``status`` means accepted, else the error to raise."""
    if 200 <= status < 300:
        return None
    if status in _RETRYABLE_STATUS or status >= 500:
        return AlertDeliveryError(f"HTTP {status}")
    return AlertRejected(f"HTTP {status}")


class HttpDestination:
    """An :class:`httpx.AsyncClient` for one URL, opened by ``start()`` and closed by ``stop()``."""

    def __init__(
        self,
        name: str,
        url: str,
        *,
        timeout_seconds: float,
        headers: Mapping[str, str] | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.name = name
        self._url = url
        self._timeout = timeout_seconds
        self._headers = {"user-agent": USER_AGENT, **(headers or {})}
        self._transport = transport
        self._client: httpx.AsyncClient | None = None
        self._health = DestinationHealth(name)

    async def start(self) -> None:
        if self._client is None:
            self._client = httpx.AsyncClient(
                timeout=self._timeout, headers=self._headers, transport=self._transport, follow_redirects=False
            )

    async def stop(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()

    async def post(self, content: bytes, headers: Mapping[str, str]) -> None:
        """POST ``content``; returns on 2xx, else raises as classified in the module docstring."""
        client = self._client
        if client is None:
            raise AlertDeliveryError("sink not started")
        try:
            async with client.stream("POST", self._url, content=content, headers=dict(headers)) as response:
                status = response.status_code
        except httpx.TimeoutException as exc:
            raise self._failed(AlertDeliveryError(f"timeout ({type(exc).__name__})")) from None
        except httpx.InvalidURL:
            raise self._failed(AlertRejected("invalid URL")) from None
        except httpx.HTTPError as exc:  # transport errors: refused, reset, DNS, TLS, protocol
            raise self._failed(AlertDeliveryError(type(exc).__name__)) from None
        error = classify_status(status)
        if error is None:
            self._health.ok()
            return
        raise self._failed(error)

    def _failed(self, error: AlertDeliveryError | AlertRejected) -> AlertDeliveryError | AlertRejected:
        # A destination that is down, or refuses every alert (401, 403, 404, a redirect), makes the
        # sink unready until an alert gets through again. One that refuses *this* alert (400, 413,
        # 422) is working: the alert is dropped (the stage counts it), readiness is unchanged.
        # The stage logs and counts every failed delivery; the sink only keeps its readiness.
        if error.reason not in _THIS_ALERT_REFUSED:
            self._health.failed(error.reason)
        return error

    def health(self) -> Health:
        if self._client is None:
            return Health(self.name, False, "not started")
        return self._health.health()
