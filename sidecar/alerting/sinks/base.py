"""The seam every alert destination implements.

A sink delivers one alert per :meth:`AlertSink.send` call and says how it went by raising, or
not: it returns once the destination has *accepted* the alert (an MQTT PUBACK at QoS 1, a 2xx
from Alertmanager or a webhook receiver, a Kafka acknowledgement with ``acks=all``). It raises
:class:`AlertDeliveryError` (retryable: the destination is down, slow, or answered 429/5xx) or
:class:`AlertRejected` (permanent: the destination refuses this alert, e.g. a 4xx other than
408/429). It never retries itself: the stage retries every sink through the one shared layer
(:func:`sidecar.retry.until_accepted`), waiting out outages (backpressure) and dropping only
rejected alerts, counted. Sinks must be safe to call concurrently.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from sidecar.alerting.alert import Alert
from sidecar.errors import PermanentError, RetryableError
from sidecar.lifecycle import Health


class AlertDeliveryError(RetryableError):
    """The destination did not accept the alert this time; try again later."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class AlertRejected(PermanentError):
    """The destination refuses this alert; sending it again would not help."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@runtime_checkable
class AlertSink(Protocol):
    """One alert destination (MQTT, Alertmanager, a webhook, a Kafka topic)."""

    name: str

    async def start(self) -> None:
        """Connect (or prepare to); returns quickly, never fails for an unreachable destination."""
        ...

    async def stop(self) -> None:
        """Close connections; idempotent, safe without ``start()``."""
        ...

    async def send(self, alert: Alert) -> None:
        """Deliver one alert; returns once accepted, else raises (see the module docstring)."""
        ...

    def health(self) -> Health:
        """Ready while the destination accepts alerts (shown on ``/readyz``)."""
        ...
