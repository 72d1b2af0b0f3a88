"""Kafka producers for the results topic (the journal) and the dead-letter topic."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import msgspec
import structlog
from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError, MessageSizeTooLargeError

from sidecar.kafka_clients import client_kwargs, durable_producer_kwargs
from sidecar.retry import until_accepted
from sidecar.source.config import KafkaConfig
from sidecar.source.journal import SourceRecord
from sidecar.source.result_record import ResultRecord
from sidecar.telemetry.stream_metrics import StreamMetrics

log = structlog.get_logger(__name__)

BACKOFF_INITIAL_SECONDS = 0.1
BACKOFF_MAX_SECONDS = 5.0
MAX_DETAIL_BYTES = 1024
# A results record larger than this is written with its outcome replaced by an error marker:
# brokers refuse records over message.max.bytes (1 MiB by default), and one refused record would
# otherwise pin its partition's commit point forever.
MAX_RESULT_BYTES = 512 * 1024
# Transient write failures (a broker restarting) only make the sidecar unready once they have
# lasted this long; a permanent one (authorisation, a record the broker refuses) at once.
UNHEALTHY_AFTER_SECONDS = 30.0


class WriteHealth:
    """Whether writes to Kafka are getting through, for ``/readyz`` (shared by both writers)."""

    def __init__(self) -> None:
        self._failing_since: float | None = None
        self._permanent = False
        self._error = ""

    def ok(self) -> None:
        self._failing_since = None
        self._permanent = False

    def failed(self, exc: BaseException, *, permanent: bool) -> None:
        if self._failing_since is None:
            self._failing_since = time.monotonic()
        self._permanent = self._permanent or permanent
        self._error = type(exc).__name__

    def status(self) -> tuple[bool, str]:
        if self._failing_since is None:
            return True, "ok"
        age = time.monotonic() - self._failing_since
        healthy = not self._permanent and age < UNHEALTHY_AFTER_SECONDS
        return healthy, f"{self._error} for {age:.0f}s"


# Results are written in batches the writer fills itself (see sidecar.source.results); a batch
# closes at this size. 256 KiB holds ~700 typical outcomes and stays far below the brokers'
# default message.max.bytes (1 MiB), so a full batch is never refused for its size.
RESULT_BATCH_BYTES = 256 * 1024


def make_producer(cfg: KafkaConfig, *, linger_ms: int = 5) -> AIOKafkaProducer:
    """The results, dead-letter and OTel-door producer.

    The source's producer lingers 0 ms: its results writer batches by itself, and a lingering
    batch is sent by the client's own timer, which after a stall of the process can fire before
    the member fence sees the stall (sidecar/source/fence.py)."""
    return AIOKafkaProducer(
        **client_kwargs(cfg),
        **durable_producer_kwargs(cfg),
        linger_ms=linger_ms,
        max_batch_size=RESULT_BATCH_BYTES,
        max_request_size=max(cfg.max_record_bytes + 65_536, 1_048_576),
    )


async def send_until_acked(
    producer: AIOKafkaProducer,
    metrics: StreamMetrics,
    health: WriteHealth,
    what: str,
    **send_kwargs: Any,
) -> Any:
    """Send one record, retrying with capped, jittered backoff until the brokers acknowledge it.

    Outages are waited out rather than turned into loss: the partition's pending-effect bound
    then stops consumption, which is the backpressure the operator sees in the lag metric. A
    permanent error (authorisation, an unknown topic) is retried too, slowly, since dropping the
    record would lose an effect, but it makes the sidecar unready at once, with the error named.
    A record the broker refuses for its size is the caller's to shrink: that error propagates.
    """

    async def send() -> Any:
        return await (await producer.send(**send_kwargs))

    def failed(exc: BaseException, delay: float) -> None:
        assert isinstance(exc, KafkaError)
        permanent = not exc.retriable
        metrics.results_write_errors.labels("permanent" if permanent else "retryable").inc()
        health.failed(exc, permanent=permanent)
        log.warning("kafka.write_failed", target=what, error=type(exc).__name__, retry_in_seconds=round(delay, 2))

    md = await until_accepted(
        send,
        retryable=lambda exc: isinstance(exc, KafkaError) and not isinstance(exc, MessageSizeTooLargeError),
        on_retry=failed,
        initial_seconds=BACKOFF_INITIAL_SECONDS,
        cap_seconds=BACKOFF_MAX_SECONDS,
    )
    health.ok()
    return md


async def flush_producer(producer: AIOKafkaProducer, timeout_seconds: float) -> bool:
    """Wait until every record handed to ``producer`` is acknowledged or failed; False on timeout."""
    try:
        async with asyncio.timeout(timeout_seconds):
            await producer.flush()
    except TimeoutError:
        return False
    return True


_ENCODER = msgspec.json.Encoder()


def encode_result(record: ResultRecord, metrics: StreamMetrics) -> bytes:
    """The record's bytes (compact JSON; NaN and infinities become null, so it is always valid JSON).

    An outcome too large to be written, or not JSON-serialisable (a hook returned an object), is
    replaced by an error marker: the effect is still recorded, and its partition never stalls on it.
    """
    try:
        value = _ENCODER.encode(record)
    except (TypeError, ValueError, OverflowError) as exc:
        metrics.results_write_errors.labels("unserialisable").inc()
        log.warning("kafka.result_unserialisable", kind=record.kind, error=type(exc).__name__)
        return _ENCODER.encode(msgspec.structs.replace(record, outcome={"error": "result_unserialisable"}))
    if len(value) <= MAX_RESULT_BYTES:
        return value
    metrics.results_write_errors.labels("oversized").inc()
    log.warning("kafka.result_too_large", kind=record.kind, size_bytes=len(value))
    return too_large(record, len(value))


def too_large(record: ResultRecord, size_bytes: int) -> bytes:
    """The record with its outcome replaced by the ``result_too_large`` marker, encoded."""
    return _ENCODER.encode(msgspec.structs.replace(record, outcome={"error": "result_too_large", "bytes": size_bytes}))


class KafkaDeadLetterWriter:
    """Copies rejected records to the dead-letter topic with the reason in headers."""

    def __init__(
        self, producer: AIOKafkaProducer, cfg: KafkaConfig, metrics: StreamMetrics, health: WriteHealth
    ) -> None:
        self._producer = producer
        self._cfg = cfg
        self._metrics = metrics
        self._health = health

    async def dead_letter(self, record: SourceRecord, reason: str, detail: str) -> None:
        headers = [
            ("dlq.reason", reason.encode()),
            ("dlq.detail", detail.encode("utf-8", "replace")[:MAX_DETAIL_BYTES]),
            ("dlq.source.topic", record.topic.encode()),
            ("dlq.source.partition", str(record.partition).encode()),
            ("dlq.source.offset", str(record.offset).encode()),
            ("dlq.time_ms", str(int(time.time() * 1000)).encode()),
        ]
        # A record needs a key or a value; an unreadable record has neither (its location is in the
        # headers), so it gets an empty key.
        key = record.key if record.key is not None or record.value is not None else b""
        try:
            await send_until_acked(
                self._producer,
                self._metrics,
                self._health,
                "dead_letter",
                topic=self._cfg.dead_letter_topic,
                value=record.value,
                key=key,
                headers=headers,
            )
        except MessageSizeTooLargeError:
            # Too large even for the dead-letter topic: keep the reason and where to find the
            # original (source topic, partition, offset) rather than block the partition forever.
            size = len(record.value or b"")
            headers.append(("dlq.value_dropped_bytes", str(size).encode()))
            await send_until_acked(
                self._producer,
                self._metrics,
                self._health,
                "dead_letter",
                topic=self._cfg.dead_letter_topic,
                value=None,
                key=(record.key or b"")[:1024],
                headers=headers,
            )
