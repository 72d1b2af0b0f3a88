"""One exception hierarchy for the whole sidecar.

Every boundary (Kafka, vLLM, MQTT, HTTP sinks, config) decides once whether a failure is
retryable or permanent and raises the matching subclass; callers never inspect messages.
"""

from __future__ import annotations


class SidecarError(Exception):
    """Root of every error the sidecar raises on purpose."""


class ConfigError(SidecarError):
    """The configuration is invalid; the process should refuse to start."""


class BrokerError(SidecarError):
    """The Kafka brokers cannot be used as configured; the process should refuse to start."""


class BrokerCapabilityError(BrokerError):
    """The brokers lack what ``kafka.processing_guarantee`` needs (see sidecar.source.capabilities)."""


class BrokerUnreachableError(BrokerError):
    """No broker answered at start-up within the request timeout."""


class RetryableError(SidecarError):
    """A transient failure (timeout, connection refused, 5xx, overload): retry with backoff."""


class PermanentError(SidecarError):
    """A failure that retrying cannot fix (bad request, bad data): count, log once, move on."""


class DecodeError(PermanentError):
    """A Kafka record cannot be turned into a valid event.

    ``reason`` is a short stable identifier (metric label and dead-letter header); ``detail`` is a
    human-readable explanation that never contains message text.
    """

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail
