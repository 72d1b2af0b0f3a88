"""Kafka producers for the results topic (the journal) and the dead-letter topic."""

from __future__ import annotations

import asyncio
import json
import random
import time
from typing import Any

import structlog
from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError, MessageSizeTooLargeError
from aiokafka.helpers import create_ssl_context

from sidecar.source.config import KafkaConfig
from sidecar.source.journal import SourceRecord
from sidecar.source.journal_entry import JournalSigner
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


def client_kwargs(cfg: KafkaConfig) -> dict[str, Any]:
    """Connection settings shared by every Kafka client of the sidecar (TLS and SASL included)."""
    kw: dict[str, Any] = {
        "bootstrap_servers": cfg.bootstrap_servers,
        "client_id": cfg.client_id,
        "request_timeout_ms": cfg.request_timeout_ms,
        "security_protocol": cfg.security_protocol,
    }
    if cfg.security_protocol in ("SSL", "SASL_SSL"):
        kw["ssl_context"] = create_ssl_context(
            cafile=cfg.ssl_cafile, certfile=cfg.ssl_certfile, keyfile=cfg.ssl_keyfile
        )
    if cfg.security_protocol.startswith("SASL"):
        assert cfg.sasl_password is not None  # enforced by KafkaConfig's validator
        kw["sasl_mechanism"] = cfg.sasl_mechanism
        kw["sasl_plain_username"] = cfg.sasl_username
        kw["sasl_plain_password"] = cfg.sasl_password.get_secret_value()
    return kw


def make_producer(cfg: KafkaConfig) -> AIOKafkaProducer:
    return AIOKafkaProducer(
        **client_kwargs(cfg),
        acks="all",
        enable_idempotence=True,
        linger_ms=5,
        max_request_size=max(cfg.max_record_bytes + 65_536, 1_048_576),
    )


async def _send_until_acked(
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
    delay = BACKOFF_INITIAL_SECONDS
    while True:
        try:
            fut = await producer.send(**send_kwargs)
            md = await fut
        except MessageSizeTooLargeError:
            raise
        except KafkaError as exc:
            permanent = not exc.retriable
            metrics.results_write_errors.labels("permanent" if permanent else "retryable").inc()
            health.failed(exc, permanent=permanent)
            log.warning("kafka.write_failed", target=what, error=type(exc).__name__, retry_in_seconds=delay)
            await asyncio.sleep(delay * (0.5 + random.random()))
            delay = min(delay * 2, BACKOFF_MAX_SECONDS)
        else:
            health.ok()
            return md


async def flush_producer(producer: AIOKafkaProducer, timeout_seconds: float) -> bool:
    """Wait until every record handed to ``producer`` is acknowledged or failed; False on timeout."""
    try:
        await asyncio.wait_for(producer.flush(), timeout_seconds)
    except TimeoutError:
        return False
    return True


def encode_result(record: dict[str, Any], metrics: StreamMetrics) -> bytes:
    """The record's bytes; an outcome too large to be written is replaced by an error marker."""
    value = json.dumps(record, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    if len(value) <= MAX_RESULT_BYTES:
        return value
    metrics.results_write_errors.labels("oversized").inc()
    log.warning("kafka.result_too_large", kind=record.get("kind"), size_bytes=len(value))
    shrunk = {**record, "outcome": {"error": "result_too_large", "bytes": len(value)}}
    return json.dumps(shrunk, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


class KafkaResultsWriter:
    """Appends hook outcomes to the results topic; the partition is ``source % partitions``."""

    def __init__(
        self, producer: AIOKafkaProducer, cfg: KafkaConfig, metrics: StreamMetrics, signer: JournalSigner
    ) -> None:
        self._producer = producer
        self._cfg = cfg
        self._metrics = metrics
        self._signer = signer
        self.write_health = WriteHealth()
        self._partitions: int | None = None
        # Resend loops of failed writes, per source partition, so that giving one partition up
        # (revoke) stops its resends without touching the others'.
        self._retries: dict[int, set[asyncio.Task[None]]] = {}

    async def partition_count(self) -> int:
        if self._partitions is None:
            parts = await self._producer.partitions_for(self._cfg.results_topic)
            self._partitions = len(parts)
        return self._partitions

    async def submit(
        self, source_partition: int, conversation_id: str, record: dict[str, Any]
    ) -> asyncio.Future[int]:
        n = self._partitions or await self.partition_count()
        record["group"] = self._cfg.group_id
        record["topic"] = self._cfg.topic
        self._signer.sign(record)
        kwargs = {
            "topic": self._cfg.results_topic,
            "value": encode_result(record, self._metrics),
            "key": conversation_id.encode("utf-8"),
            "partition": source_partition % n,
        }
        done: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        try:
            sent = await self._producer.send(**kwargs)
        except KafkaError:
            self._retry(source_partition, done, kwargs)
            return done

        def on_ack(f: asyncio.Future[Any]) -> None:
            if done.done():
                return
            if f.cancelled() or f.exception() is not None:
                self._retry(source_partition, done, kwargs)
            else:
                self.write_health.ok()
                done.set_result(int(f.result().offset))

        sent.add_done_callback(on_ack)
        return done

    def _retry(self, source_partition: int, done: asyncio.Future[int], kwargs: dict[str, Any]) -> None:
        """Slow path: a send failed; resend with backoff until acknowledged."""

        async def resend() -> None:
            try:
                md = await _send_until_acked(self._producer, self._metrics, self.write_health, "results", **kwargs)
            except MessageSizeTooLargeError as exc:
                # The broker's limit is below ours: record the effect as an error marker instead.
                self.write_health.failed(exc, permanent=False)
                record = json.loads(kwargs["value"])
                small = {**record, "outcome": {"error": "result_too_large", "bytes": len(kwargs["value"])}}
                small_kwargs = {**kwargs, "value": json.dumps(small, separators=(",", ":")).encode()}
                md = await _send_until_acked(
                    self._producer, self._metrics, self.write_health, "results", **small_kwargs
                )
            if not done.done():
                done.set_result(int(md.offset))

        task = asyncio.ensure_future(resend())
        tasks = self._retries.setdefault(source_partition, set())
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        done.add_done_callback(lambda f: task.cancel() if f.cancelled() else None)

    async def flush(self, source_partition: int, timeout_seconds: float) -> bool:
        for task in list(self._retries.pop(source_partition, ())):
            task.cancel()
        return await flush_producer(self._producer, timeout_seconds)

    def health(self) -> tuple[bool, str]:
        return self.write_health.status()

    async def append(self, source_partition: int, conversation_id: str, record: dict[str, Any]) -> int:
        """Submit and wait for the acknowledgement."""
        return await (await self.submit(source_partition, conversation_id, record))


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
            await _send_until_acked(
                self._producer, self._metrics, self._health, "dead_letter",
                topic=self._cfg.dead_letter_topic, value=record.value, key=key, headers=headers,
            )
        except MessageSizeTooLargeError:
            # Too large even for the dead-letter topic: keep the reason and where to find the
            # original (source topic, partition, offset) rather than block the partition forever.
            size = len(record.value or b"")
            headers.append(("dlq.value_dropped_bytes", str(size).encode()))
            await _send_until_acked(
                self._producer, self._metrics, self._health, "dead_letter",
                topic=self._cfg.dead_letter_topic, value=None, key=(record.key or b"")[:1024], headers=headers,
            )
