"""Where simulated events go: a JSONL file or a Kafka topic, paced to a rate.

Events are contract-v1 dicts built by :func:`sidecar.tools.demo.replay.conversation_events` and encoded
by :func:`sidecar.tools.demo.replay.encode` (the same key and value bytes the demo replay produces).

Guarantees: one conversation's events are sent in order (each ``send`` is awaited before the
conversation's next message exists); the Kafka writer produces with ``acks=all``, keyed by the
conversation id, bounds the sends awaiting acknowledgement, and raises a delivery failure at the
latest in ``stop()``. :class:`RatePacer` spaces all sends of a run at most ``rate`` per second.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any, Protocol

from aiokafka import AIOKafkaProducer

from sidecar.kafka_clients import plaintext_client_kwargs
from sidecar.tools.demo.replay import encode

# Sends awaiting acknowledgement at most: bounds memory while keeping the producer's batches full.
_MAX_IN_FLIGHT = 1000


class EventWriter(Protocol):
    """A destination for events. ``start`` before the first ``send``; ``stop`` is idempotent."""

    async def start(self) -> None: ...

    async def send(self, event: Mapping[str, Any]) -> None: ...

    async def stop(self) -> None: ...


class JsonlEventWriter:
    """Events as JSON lines (the Kafka value bytes, one per line) in a file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fh: IO[bytes] | None = None
        self.sent = 0

    async def start(self) -> None:
        if self._fh is None:
            self._fh = self.path.open("wb")

    async def send(self, event: Mapping[str, Any]) -> None:
        if self._fh is None:
            raise RuntimeError("JsonlEventWriter.send before start")
        _, value = encode(event)
        self._fh.write(value + b"\n")
        self.sent += 1

    async def stop(self) -> None:
        fh, self._fh = self._fh, None
        if fh is not None:
            fh.close()


class KafkaEventWriter:
    """Events to a Kafka topic (key: conversation id; ``acks=all``)."""

    def __init__(self, bootstrap_servers: str, topic: str, client_id: str = "sidecar-simulator") -> None:
        self.bootstrap_servers = bootstrap_servers
        self.topic = topic
        self._client_id = client_id
        self._producer: AIOKafkaProducer | None = None
        self._in_flight: set[asyncio.Future[Any]] = set()
        self.sent = 0

    async def start(self) -> None:
        if self._producer is None:
            producer = AIOKafkaProducer(
                **plaintext_client_kwargs(self.bootstrap_servers, client_id=self._client_id), acks="all", linger_ms=5
            )
            try:
                await producer.start()
            except BaseException:
                await producer.stop()  # a producer that could not start still holds its client
                raise
            self._producer = producer

    async def send(self, event: Mapping[str, Any]) -> None:
        if self._producer is None:
            raise RuntimeError("KafkaEventWriter.send before start")
        key, value = encode(event)
        self._in_flight.add(await self._producer.send(self.topic, value=value, key=key))
        self.sent += 1
        if len(self._in_flight) >= _MAX_IN_FLIGHT:
            done, self._in_flight = await asyncio.wait(self._in_flight, return_when=asyncio.FIRST_COMPLETED)
            for fut in done:
                fut.result()

    async def stop(self) -> None:
        producer, self._producer = self._producer, None
        if producer is None:
            return
        try:
            pending, self._in_flight = self._in_flight, set()
            if pending:
                await asyncio.gather(*pending)
        finally:
            await producer.stop()


class RatePacer:
    """Spaces calls to :meth:`wait` at least ``1 / rate`` seconds apart (``rate=None``: no pacing)."""

    def __init__(self, rate: float | None) -> None:
        self._interval = 1.0 / rate if rate else 0.0
        self._next = 0.0
        self._lock = asyncio.Lock()

    async def wait(self) -> None:
        if not self._interval:
            return
        async with self._lock:
            now = time.monotonic()
            slot = max(now, self._next)
            self._next = slot + self._interval
            if slot > now:
                await asyncio.sleep(slot - now)
