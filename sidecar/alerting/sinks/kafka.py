"""Alerts to a Kafka topic, on the sidecar's own Kafka connection settings (``kafka.*``).

The producer uses ``acks=all`` (and is idempotent under ``kafka.processing_guarantee:
exactly_once``): :meth:`KafkaAlertSink.send` returns once every in-sync replica has the record.
Records are keyed by conversation id (one conversation's alerts stay in order on one partition);
the value is the alert JSON, and headers repeat the alert id, kind and schema so consumers can
route or dedupe without parsing the value.

The producer connects in a background task (``start()`` never waits for the brokers), retrying
with capped backoff until the cluster answers; ``send`` waits for it within ``timeout_seconds``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import structlog
from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError, KafkaTimeoutError

from sidecar.alerting.alert import Alert
from sidecar.alerting.config import KafkaAlertSinkConfig, RetryConfig
from sidecar.alerting.sinks._common import DestinationHealth, dump_json, wire_payload
from sidecar.alerting.sinks.base import AlertDeliveryError, AlertRejected
from sidecar.kafka_clients import client_kwargs, durable_producer_kwargs
from sidecar.lifecycle import Health
from sidecar.retry import Backoff
from sidecar.source.config import KafkaConfig
from sidecar.supervision import Supervised, spawn

log = structlog.get_logger(__name__)

ProducerFactory = Callable[[], AIOKafkaProducer]


def make_alert_producer(kafka: KafkaConfig) -> AIOKafkaProducer:
    """An ``acks=all`` producer (idempotent under ``exactly_once``) with the sidecar's connection,
    TLS and SASL settings."""
    kw = client_kwargs(kafka, client_id=f"{kafka.client_id}-alerts")
    return AIOKafkaProducer(**kw, **durable_producer_kwargs(kafka))


class KafkaAlertSink:
    """An :class:`~sidecar.alerting.sinks.base.AlertSink` producing alert JSON to one topic."""

    name = "kafka"

    def __init__(
        self,
        cfg: KafkaAlertSinkConfig,
        kafka: KafkaConfig,
        retry: RetryConfig | None = None,
        *,
        producer_factory: ProducerFactory | None = None,
    ) -> None:
        self._cfg = cfg
        self._retry = retry or RetryConfig()
        self._factory = producer_factory or (lambda: make_alert_producer(kafka))
        self._task: Supervised | None = None
        self._producer: AIOKafkaProducer | None = None
        self._ready = asyncio.Event()
        self._link = DestinationHealth(self.name)  # until the producer has started
        self._link.failed("connecting")
        self._acks = DestinationHealth(self.name)  # the last sends, once it has

    async def start(self) -> None:
        if self._task is None:
            # Ends once connected: only a failure is a death.
            self._task = spawn("alert-sink-kafka", self._connect, until_cancelled=False)

    async def _connect(self) -> None:
        backoff = Backoff(self._retry.initial_backoff_seconds, self._retry.max_backoff_seconds)
        failures = 0
        while True:
            producer = self._factory()
            try:
                await producer.start()
            except KafkaError as exc:
                await producer.stop()  # a producer that failed to start still holds its client
                delay = backoff.delay()
                failures += 1
                self._link.failed(f"connecting: {type(exc).__name__}")
                (log.warning if failures == 1 else log.debug)(
                    "alert.kafka.connect_failed", error=type(exc).__name__, retry_in_seconds=round(delay, 2)
                )
                await asyncio.sleep(delay)
                continue
            self._producer = producer
            self._link.ok()
            self._ready.set()
            log.info("alert.kafka.connected", topic=self._cfg.topic)
            return

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            await task.stop()  # never raises the task's CancelledError; our own propagates
        producer, self._producer = self._producer, None
        self._ready.clear()
        if producer is not None:
            # Flushes what is in flight; an alert not acknowledged by then is re-sent after a restart.
            await producer.stop()

    async def send(self, alert: Alert) -> None:
        payload = wire_payload(alert)
        value = dump_json(payload)
        key = payload["conversation_id"].encode("utf-8")
        headers = [("alert_id", alert.id.encode()), ("kind", alert.kind.encode()), ("schema", b"alert-v1")]
        if self._task is None:
            raise AlertDeliveryError("sink not started")
        timeout = self._cfg.timeout_seconds
        waiting_for = "connection to the brokers"
        try:
            async with asyncio.timeout(timeout):
                await self._ready.wait()
                waiting_for = "acknowledgement"
                producer = self._producer
                assert producer is not None  # set before the event
                await producer.send_and_wait(self._cfg.topic, value=value, key=key, headers=headers)
        except TimeoutError:
            reason = f"no {waiting_for} within {timeout:g}s"
            self._acks.failed(reason)
            raise AlertDeliveryError(reason) from None
        except KafkaError as exc:
            reason = type(exc).__name__
            # KafkaTimeoutError is marked not retriable by aiokafka, yet it only means "no answer in time".
            if exc.retriable or isinstance(exc, KafkaTimeoutError):
                self._acks.failed(reason)
                raise AlertDeliveryError(reason) from None
            # Too large, not authorised, an invalid topic: the same record would fail the same way.
            raise AlertRejected(reason) from None
        self._acks.ok()

    def health(self) -> Health:
        task = self._task
        if task is None:
            return Health(self.name, False, "not started")
        if task.error is not None:
            return Health(self.name, False, f"connection task failed: {type(task.error).__name__}")
        if self._link.failing:
            return self._link.health()
        return self._acks.health(f"producing to {self._cfg.topic}")
