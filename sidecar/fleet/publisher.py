"""``TablePublisher``: writes rows of a fleet table's compacted topic, acknowledged or raised."""

from __future__ import annotations

import asyncio

from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError

from sidecar.errors import RetryableError
from sidecar.source.config import KafkaConfig
from sidecar.source.writers import make_producer


class PublishFailed(RetryableError):
    """The row was not acknowledged in time; the caller decides when to try again."""


class TablePublisher:
    """One producer (the sidecar's durable settings: ``acks=all``, idempotent under
    ``exactly_once``), started with the first row so a replica starts while Kafka is down."""

    def __init__(self, topic: str, kafka: KafkaConfig) -> None:
        self.topic = topic
        self._kafka = kafka
        self._producer: AIOKafkaProducer | None = None
        self._starting = asyncio.Lock()

    async def start(self) -> None:
        """Nothing to do: the Kafka client starts with the first row."""

    async def stop(self) -> None:
        producer, self._producer = self._producer, None
        if producer is not None:
            await producer.stop()

    async def publish(self, key: str, value: bytes | None, *, timeout_seconds: float) -> None:
        """Write one row (``None``: a tombstone) and wait for the brokers' acknowledgement; raise
        :class:`PublishFailed` when it does not come within ``timeout_seconds``."""
        try:
            async with asyncio.timeout(timeout_seconds):
                producer = await self._ready()
                await producer.send_and_wait(self.topic, value=value, key=key.encode("utf-8"))
        except TimeoutError:
            raise PublishFailed(f"{self.topic}: not acknowledged within {timeout_seconds}s") from None
        except KafkaError as exc:
            raise PublishFailed(f"{self.topic}: {type(exc).__name__}") from exc

    async def _ready(self) -> AIOKafkaProducer:
        async with self._starting:
            if self._producer is None:
                producer = make_producer(self._kafka)
                try:
                    await producer.start()
                except BaseException:
                    await producer.stop()
                    raise
                self._producer = producer
            return self._producer
