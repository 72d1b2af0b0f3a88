"""Producing derived events: ``acks=all``, idempotent under ``exactly_once``, and a batch counts
only once every record of it is acknowledged (the doors answer or commit only then)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError

from sidecar.errors import RetryableError
from sidecar.source.config import KafkaConfig
from sidecar.source.writers import make_producer

Headers = list[tuple[str, bytes]]


class KafkaUnavailable(RetryableError):
    """The batch was not acknowledged in time (brokers down, a partition without leader)."""


class OtelEventProducer:
    """The ingest's one producer (events topic and the bridge's dead-letter topic).

    Started lazily by the first batch, so a door starts (and answers 503) while Kafka is down."""

    def __init__(self, kafka: KafkaConfig) -> None:
        self._kafka = kafka
        self._producer: AIOKafkaProducer | None = None
        self._starting = asyncio.Lock()

    async def start(self) -> None:
        """Nothing to do: the Kafka client starts with the first batch."""

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

    async def produce(
        self,
        topic: str,
        records: Sequence[tuple[bytes, bytes | None]],
        *,
        timeout_seconds: float,
        headers: Headers | None = None,
    ) -> None:
        """Send every record and wait for all acknowledgements; raises :class:`KafkaUnavailable`
        when that does not happen within ``timeout_seconds`` (some records may still land: their
        ids make a second copy harmless)."""
        if not records:
            return
        try:
            async with asyncio.timeout(timeout_seconds):
                producer = await self._ready()
                futures = [await producer.send(topic, value=v, key=k, headers=headers) for k, v in records]
                await asyncio.gather(*futures)
        except TimeoutError:
            raise KafkaUnavailable(f"not acknowledged within {timeout_seconds}s") from None
        except KafkaError as exc:
            raise KafkaUnavailable(type(exc).__name__) from exc

    async def stop(self) -> None:
        """Flush and close. Idempotent; safe without a batch ever sent."""
        producer, self._producer = self._producer, None
        if producer is not None:
            await producer.stop()
