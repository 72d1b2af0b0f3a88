"""Door two: a bridge from the topic the Collector's ``kafka`` exporter writes to the events topic.

Records are ``otlp_proto`` or ``otlp_json`` ``TracesData`` (one record may batch many traces; with
``partition_traces_by_id`` one conversation's traces still land on different partitions). Each poll
is one step: decode every record, derive the events, produce them (and the dead letters) with
``acks=all``, and only once all are acknowledged commit the input offsets. A crash anywhere re-reads
the step; its spans yield the same event ids, which the sidecar's dedup drops: at-least-once
delivery, effectively exactly-once effects.

With ``logs_topic`` set, the Collector's logs topic is read too: GenAI content sent as log records
(:mod:`sidecar.otel.logs`) is joined to its spans by trace and span id, as at the receiver's
``/v1/logs``.

A record with a span (or content) held back (``otel.hold``: a late parent, model calls read out of order) is not
committed past until that span is decided: a restart reads it again and holds it again.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Final, cast

import structlog
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import CommitFailedError, KafkaError
from opentelemetry.proto.logs.v1.logs_pb2 import LogsData
from opentelemetry.proto.trace.v1.trace_pb2 import TracesData

from sidecar.kafka_clients import client_kwargs
from sidecar.lifecycle import Health
from sidecar.otel.config import OtlpKafkaBridgeConfig
from sidecar.otel.decode import Encoding, decode_logs_request, decode_traces, sniff
from sidecar.otel.errors import OtelRefused
from sidecar.otel.ingest import OtelIngest
from sidecar.otel.metrics import OtelMetrics
from sidecar.otel.producer import KafkaUnavailable, OtelEventProducer
from sidecar.otel.work import work_for
from sidecar.retry import Backoff
from sidecar.source.config import KafkaConfig
from sidecar.supervision import Supervised, spawn

log = structlog.get_logger(__name__)

DOOR: Final = "bridge"
POLL_TIMEOUT_MS = 1000
PRODUCE_TIMEOUT_SECONDS = 30.0
BACKOFF_INITIAL_SECONDS = 0.2
BACKOFF_MAX_SECONDS = 10.0
# Log records one record of the logs topic may hold (its size is bounded by max_record_bytes).
MAX_LOG_RECORDS = 1_000_000


class OtlpKafkaBridge:
    """The bridge as a component: ``start()`` spawns the ``otel-bridge`` task, ``stop()`` ends it."""

    def __init__(
        self,
        config: OtlpKafkaBridgeConfig,
        kafka: KafkaConfig,
        ingest: OtelIngest,
        producer: OtelEventProducer,
        metrics: OtelMetrics,
    ) -> None:
        self._cfg = config
        self._kafka = kafka
        self._ingest = ingest
        self._producer = producer
        self._metrics = metrics
        self._task: Supervised | None = None
        self._consumer: AIOKafkaConsumer | None = None
        self._last_commit: float | None = None

    async def start(self) -> None:
        if self._task is None:
            self._task = spawn("otel-bridge", self._run)

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            await task.stop()

    def health(self) -> Health:
        if self._task is None:
            return Health("otel-bridge", False, "not started")
        if self._task.death is not None:
            return Health("otel-bridge", False, f"task {self._task.death}")
        return Health("otel-bridge", True, "consuming" if self._last_commit is not None else "starting")

    async def _run(self) -> None:
        backoff = Backoff(BACKOFF_INITIAL_SECONDS, BACKOFF_MAX_SECONDS)
        while True:
            topics = [self._cfg.topic] + ([self._cfg.logs_topic] if self._cfg.logs_topic else [])
            consumer = AIOKafkaConsumer(
                *topics,
                **client_kwargs(self._kafka),
                group_id=self._cfg.group_id,
                enable_auto_commit=False,
                auto_offset_reset="earliest",
                max_poll_records=self._cfg.fetch_max_records,
                fetch_max_bytes=max(self._kafka.fetch_max_bytes, self._cfg.max_record_bytes),
                max_partition_fetch_bytes=max(1_048_576, self._cfg.max_record_bytes),
            )
            try:
                await consumer.start()
                backoff.reset()
                await self._consume(consumer)
            except KafkaError as exc:
                delay = backoff.delay()
                log.warning("otel.bridge_kafka_error", error=type(exc).__name__, retry_in_seconds=round(delay, 2))
                await asyncio.sleep(delay)
            finally:
                await consumer.stop()

    async def _consume(self, consumer: AIOKafkaConsumer) -> None:
        read: dict[TopicPartition, int] = {}  # next offset per partition, as far as this member read
        while True:
            batch = await consumer.getmany(timeout_ms=POLL_TIMEOUT_MS)
            if not batch and not self._ingest.due(DOOR):
                continue
            await self.step([rec for records in batch.values() for rec in records])
            read.update({tp: records[-1].offset + 1 for tp, records in batch.items()})
            read = {tp: n for tp, n in read.items() if tp in consumer.assignment()}
            offsets = self.committable(read)
            try:
                await consumer.commit(offsets)
            except CommitFailedError:
                # The partitions moved to another member, which re-reads from the last commit: the
                # events produced here come again with the same ids and are dropped by the dedup.
                log.warning("otel.bridge_commit_failed")
                continue
            self._last_commit = time.monotonic()

    def committable(self, read: dict[TopicPartition, int]) -> dict[TopicPartition, int]:
        """The offsets to commit: what was read, but never past a record whose span is held."""
        out = dict(read)
        for source in self._ingest.held_sources(DOOR):
            topic, partition, offset = cast(tuple[str, int, int], source)
            tp = TopicPartition(topic, partition)
            if tp in out:
                out[tp] = min(out[tp], offset)
        return out

    async def step(self, records: list[Any]) -> None:
        """Derive and produce a poll's records; returns once every output is acknowledged."""
        payloads: list[TracesData] = []
        sources: list[tuple[str, int, int]] = []
        logs: list[LogsData] = []
        log_sources: list[tuple[str, int, int]] = []
        dead: list[tuple[Any, OtelRefused]] = []  # (record, why)
        for rec in records:
            try:
                value = rec.value or b""
                encoding: Encoding = sniff(value) if self._cfg.encoding == "auto" else self._cfg.encoding
                if self._cfg.logs_topic is not None and rec.topic == self._cfg.logs_topic:
                    limit = self._cfg.max_record_bytes
                    logs.append(decode_logs_request(value, encoding, max_bytes=limit, max_records=MAX_LOG_RECORDS))
                    log_sources.append((rec.topic, rec.partition, rec.offset))
                    continue
                payloads.append(decode_traces(value, encoding, max_bytes=self._cfg.max_record_bytes))
                sources.append((rec.topic, rec.partition, rec.offset))
            except OtelRefused as exc:
                self._ingest.refuse_payload(DOOR, exc.reason)
                dead.append((rec, exc))
        # One derivation for the whole poll: its model calls oldest first whichever partition they
        # came from, and end signals after all of them.
        # Off the event loop, one derivation at a time with the receiver (the same history tracker).
        ingest = self._ingest
        events = (
            await work_for(ingest).run(
                lambda: ingest.derive(payloads, DOOR, sources=sources, logs=logs, log_sources=log_sources)
            )
        ).records
        backoff = Backoff(BACKOFF_INITIAL_SECONDS, BACKOFF_MAX_SECONDS)
        while True:
            try:
                await self._producer.produce(self._kafka.topic, events, timeout_seconds=PRODUCE_TIMEOUT_SECONDS)
                for rec, why in dead:
                    key = rec.key if rec.key is not None else b""  # a record needs a key or a value
                    await self._producer.produce(
                        self._cfg.dead_letter_topic,
                        [(key, rec.value)],
                        timeout_seconds=PRODUCE_TIMEOUT_SECONDS,
                        headers=_dead_letter_headers(rec, why),
                    )
                break
            except KafkaUnavailable as err:
                self._metrics.produce_errors.labels(DOOR).inc()
                delay = backoff.delay()
                log.warning("otel.produce_failed", door=DOOR, error=str(err), retry_in_seconds=round(delay, 2))
                await asyncio.sleep(delay)
        self._metrics.events.labels(DOOR).inc(len(events))
        self._metrics.bridge_records.labels("processed").inc(len(records) - len(dead))
        if dead:
            self._metrics.bridge_records.labels("dead_lettered").inc(len(dead))


def _dead_letter_headers(rec: Any, exc: OtelRefused) -> list[tuple[str, bytes]]:
    return [
        ("dlq.reason", exc.reason.encode()),
        ("dlq.detail", exc.detail.encode("utf-8", "replace")[:1024]),
        ("dlq.source.topic", str(rec.topic).encode()),
        ("dlq.source.partition", str(rec.partition).encode()),
        ("dlq.source.offset", str(rec.offset).encode()),
    ]
