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
from sidecar.telemetry.stream_metrics import StreamMetrics

log = structlog.get_logger(__name__)

BACKOFF_INITIAL_SECONDS = 0.1
BACKOFF_MAX_SECONDS = 5.0
MAX_DETAIL_BYTES = 1024


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
    what: str,
    **send_kwargs: Any,
) -> Any:
    """Send one record, retrying with capped, jittered backoff until the brokers acknowledge it.

    Outages are waited out rather than turned into loss: the partition's pending-effect bound
    then stops consumption, which is the backpressure the operator sees in the lag metric.
    """
    delay = BACKOFF_INITIAL_SECONDS
    while True:
        try:
            fut = await producer.send(**send_kwargs)
            return await fut
        except MessageSizeTooLargeError:
            raise
        except KafkaError as exc:
            metrics.results_write_errors.inc()
            log.warning("kafka.write_failed", target=what, error=type(exc).__name__, retry_in_seconds=delay)
            await asyncio.sleep(delay * (0.5 + random.random()))
            delay = min(delay * 2, BACKOFF_MAX_SECONDS)


class KafkaResultsWriter:
    """Appends hook outcomes to the results topic; the partition is ``source % partitions``."""

    def __init__(self, producer: AIOKafkaProducer, cfg: KafkaConfig, metrics: StreamMetrics) -> None:
        self._producer = producer
        self._cfg = cfg
        self._metrics = metrics
        self._partitions: int | None = None
        self._retries: set[asyncio.Task[None]] = set()

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
        kwargs = {
            "topic": self._cfg.results_topic,
            "value": json.dumps(record, separators=(",", ":"), ensure_ascii=False).encode("utf-8"),
            "key": conversation_id.encode("utf-8"),
            "partition": source_partition % n,
        }
        done: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        try:
            sent = await self._producer.send(**kwargs)
        except KafkaError:
            self._retry(done, kwargs)
            return done

        def on_ack(f: asyncio.Future[Any]) -> None:
            if f.cancelled() or f.exception() is not None:
                self._retry(done, kwargs)
            elif not done.done():
                done.set_result(int(f.result().offset))

        sent.add_done_callback(on_ack)
        return done

    def _retry(self, done: asyncio.Future[int], kwargs: dict[str, Any]) -> None:
        """Slow path: a send failed; resend with backoff until acknowledged."""
        self._metrics.results_write_errors.inc()

        async def resend() -> None:
            md = await _send_until_acked(self._producer, self._metrics, "results", **kwargs)
            if not done.done():
                done.set_result(int(md.offset))

        task = asyncio.ensure_future(resend())
        self._retries.add(task)
        task.add_done_callback(self._retries.discard)
        done.add_done_callback(lambda f: task.cancel() if f.cancelled() else None)

    async def append(self, source_partition: int, conversation_id: str, record: dict[str, Any]) -> int:
        """Submit and wait for the acknowledgement."""
        return await (await self.submit(source_partition, conversation_id, record))


class KafkaDeadLetterWriter:
    """Copies rejected records to the dead-letter topic with the reason in headers."""

    def __init__(self, producer: AIOKafkaProducer, cfg: KafkaConfig, metrics: StreamMetrics) -> None:
        self._producer = producer
        self._cfg = cfg
        self._metrics = metrics

    async def dead_letter(self, record: SourceRecord, reason: str, detail: str) -> None:
        headers = [
            ("dlq.reason", reason.encode()),
            ("dlq.detail", detail.encode("utf-8", "replace")[:MAX_DETAIL_BYTES]),
            ("dlq.source.topic", record.topic.encode()),
            ("dlq.source.partition", str(record.partition).encode()),
            ("dlq.source.offset", str(record.offset).encode()),
            ("dlq.time_ms", str(int(time.time() * 1000)).encode()),
        ]
        try:
            await _send_until_acked(
                self._producer, self._metrics, "dead_letter",
                topic=self._cfg.dead_letter_topic, value=record.value, key=record.key, headers=headers,
            )
        except MessageSizeTooLargeError:
            # Too large even for the dead-letter topic: keep the reason and where to find the
            # original (source topic, partition, offset) rather than block the partition forever.
            size = len(record.value or b"")
            headers.append(("dlq.value_dropped_bytes", str(size).encode()))
            await _send_until_acked(
                self._producer, self._metrics, "dead_letter",
                topic=self._cfg.dead_letter_topic, value=None, key=(record.key or b"")[:1024], headers=headers,
            )
