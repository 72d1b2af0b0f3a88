"""``KafkaResultsWriter``: hook outcomes into the results topic, in batches the writer fills itself.

One ``producer.send()`` per outcome costs about 17 us of Python in aiokafka; appending to a batch
builder and submitting the builder once (``send_batch``) costs a fraction of that. So ``submit``
appends the record to the open batch of its results partition and returns a future of its offset;
the batch is submitted when it is full or at the next turn of the event loop, i.e. after the
worker has gone through the records it had at hand. Same records, same format, same order, same
idempotent producer (``acks=all``; idempotent under ``kafka.processing_guarantee: exactly_once``).

A batch that fails is not resent as a batch: each of its records goes through the resend loop on
its own (capped, jittered backoff until acknowledged; see :func:`send_until_acked`), so a record
the broker refuses for its size is shrunk to an error marker without holding up the others.
"""

from __future__ import annotations

import asyncio
import functools
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import msgspec
import structlog
from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError, MessageSizeTooLargeError
from aiokafka.producer.message_accumulator import BatchBuilder

from sidecar.source.config import KafkaConfig
from sidecar.source.fence import Fence, Unfenced
from sidecar.source.journal_entry import JournalSigner
from sidecar.source.result_record import ResultRecord
from sidecar.source.writers import WriteHealth, encode_result, flush_producer, send_until_acked, too_large
from sidecar.telemetry.stream_metrics import StreamMetrics

log = structlog.get_logger(__name__)


@dataclass(slots=True)
class _Item:
    done: asyncio.Future[int]
    source_partition: int
    key: bytes
    value: bytes
    epoch: int = 0


@dataclass(slots=True)
class _OpenBatch:
    builder: BatchBuilder
    items: list[_Item] = field(default_factory=list)


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
        self._open: dict[int, _OpenBatch] = {}
        # Batches closed but not yet handed to the producer, per results partition: one batch per
        # partition is with the producer at a time (aiokafka sends one request per broker at a
        # time anyway), so that what waits behind it stays here, where the fence can still drop it.
        self._waiting: dict[int, deque[_OpenBatch]] = {}
        self._in_flight: set[int] = set()
        self._sending: set[asyncio.Task[None]] = set()
        # Resend loops of failed writes, per source partition, so that giving one partition up
        # (revoke) stops its resends without touching the others'.
        self._retries: dict[int, set[asyncio.Task[None]]] = {}
        # Set by the source: a record of a fenced epoch (this member may have lost its partition)
        # is dropped before it reaches the producer, however long it waited in an open batch.
        self.fence: Fence = Unfenced()

    async def partition_count(self) -> int:
        if self._partitions is None:
            parts = await self._producer.partitions_for(self._cfg.results_topic)
            self._partitions = len(parts)
        return self._partitions

    async def submit(self, source_partition: int, conversation_id: str, record: ResultRecord) -> asyncio.Future[int]:
        n = self._partitions or await self.partition_count()
        record.group = self._cfg.group_id
        record.topic = self._cfg.topic
        self._signer.sign(record)
        item = _Item(
            asyncio.get_running_loop().create_future(),
            source_partition,
            conversation_id.encode("utf-8"),
            encode_result(record, self._metrics),
            self.fence.epoch,
        )
        self._append(source_partition % n, item)
        return item.done

    def _append(self, partition: int, item: _Item) -> None:
        batch = self._open.get(partition)
        if batch is not None and batch.builder.append(timestamp=None, key=item.key, value=item.value) is not None:
            batch.items.append(item)
            return
        if batch is not None:
            self._ship(partition)  # full
        batch = _OpenBatch(self._producer.create_batch())
        # An empty builder takes any record (an oversized one alone; the broker may refuse it,
        # and the resend path then shrinks it).
        batch.builder.append(timestamp=None, key=item.key, value=item.value)
        batch.items.append(item)
        self._open[partition] = batch
        asyncio.get_running_loop().call_soon(self._ship_if_open, partition, batch)

    def _ship_if_open(self, partition: int, batch: _OpenBatch) -> None:
        if self._open.get(partition) is batch:
            self._ship(partition)

    def _ship(self, partition: int) -> None:
        self._waiting.setdefault(partition, deque()).append(self._open.pop(partition))
        self._pump(partition)

    def _pump(self, partition: int) -> None:
        """Hand the partition's next waiting batch to the producer, unless one is with it already."""
        waiting = self._waiting.get(partition)
        while waiting and partition not in self._in_flight:
            batch = waiting.popleft()
            if not all(self.fence.allows(i.epoch) for i in batch.items):
                batch = self._without_fenced(batch)
            if not batch.items:
                continue
            self._in_flight.add(partition)
            task = asyncio.ensure_future(self._send(partition, batch))
            self._sending.add(task)
            task.add_done_callback(functools.partial(self._sent, partition))
        if not waiting:
            self._waiting.pop(partition, None)

    def _sent(self, partition: int, task: asyncio.Task[None]) -> None:
        self._sending.discard(task)
        self._in_flight.discard(partition)
        self._pump(partition)

    async def _send(self, partition: int, batch: _OpenBatch) -> None:
        try:
            delivered = await self._producer.send_batch(batch.builder, self._cfg.results_topic, partition=partition)
            md = await delivered
        except KafkaError as exc:
            if not all(self.fence.allows(i.epoch) for i in batch.items):
                for item in batch.items:  # dropped by the fence (drop_unsent), not a broker error
                    if not item.done.done():
                        item.done.cancel()
                return
            self._metrics.results_write_errors.labels("retryable" if exc.retriable else "permanent").inc()
            self.write_health.failed(exc, permanent=not exc.retriable and not isinstance(exc, MessageSizeTooLargeError))
            for item in batch.items:
                if not item.done.done():
                    self._retry(partition, item)
            return
        self.write_health.ok()
        for i, item in enumerate(batch.items):
            if not item.done.done():
                item.done.set_result(int(md.offset) + i)

    def _without_fenced(self, batch: _OpenBatch) -> _OpenBatch:
        """The batch rebuilt from its records that may still be written."""
        return self._rebuilt(batch, lambda item: self.fence.allows(item.epoch))

    def _rebuilt(self, batch: _OpenBatch, keep: Callable[[_Item], bool]) -> _OpenBatch:
        """``batch`` with only the records ``keep`` accepts; the others are dropped (their futures
        cancelled, so their effects stay pinned and are never acknowledged)."""
        kept = _OpenBatch(self._producer.create_batch())
        for item in batch.items:
            if keep(item):
                kept.builder.append(timestamp=None, key=item.key, value=item.value)
                kept.items.append(item)
            elif not item.done.done():
                item.done.cancel()
        return kept

    def discard(self, source_partition: int) -> None:
        """Drop what ``source_partition`` still has to write, unsent: its open records and resends.

        For a partition this member may have lost: flushing would land them after the next
        owner read the journal. Records already handed to the producer cannot be called back."""
        for task in list(self._retries.pop(source_partition, ())):
            task.cancel()

        def other(item: _Item) -> bool:
            return item.source_partition != source_partition

        for partition, batch in list(self._open.items()):
            if not all(other(i) for i in batch.items):
                rest = self._rebuilt(batch, other)
                if rest.items:
                    self._open[partition] = rest
                    asyncio.get_running_loop().call_soon(self._ship_if_open, partition, rest)
                else:
                    del self._open[partition]
        for waiting in self._waiting.values():
            for i, batch in enumerate(waiting):
                if not all(other(item) for item in batch.items):
                    waiting[i] = self._rebuilt(batch, other)

    def _retry(self, partition: int, item: _Item) -> None:
        """Slow path: resend one record with backoff until acknowledged."""
        kwargs = {"topic": self._cfg.results_topic, "partition": partition, "key": item.key, "value": item.value}

        async def resend() -> None:
            if not self.fence.allows(item.epoch):
                item.done.cancel()
                return
            try:
                md = await send_until_acked(self._producer, self._metrics, self.write_health, "results", **kwargs)
            except MessageSizeTooLargeError as exc:
                # The broker's limit is below ours: record the effect as an error marker instead.
                self.write_health.failed(exc, permanent=False)
                # Decoded from its own bytes rather than kept: holding every record until its batch
                # is acknowledged costs the hot path (more live objects for the collector).
                kwargs["value"] = too_large(msgspec.json.decode(item.value, type=ResultRecord), len(item.value))
                md = await send_until_acked(self._producer, self._metrics, self.write_health, "results", **kwargs)
            if not item.done.done():
                item.done.set_result(int(md.offset))

        task = asyncio.ensure_future(resend())
        tasks = self._retries.setdefault(item.source_partition, set())
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        item.done.add_done_callback(lambda f: task.cancel() if f.cancelled() else None)

    def drop_unsent(self) -> int:
        """Fail the results batches still queued inside the Kafka client, not yet in a request.

        Called when the member fence goes up: the batch handed to the client just before a stall
        waits there behind another request, and would otherwise be sent after the wake, after the
        next owner read the journal. aiokafka has no public call for this; its accumulator keeps
        unsent batches per partition in ``_batches`` (they get no sequence number before they are
        drained, so failing them is safe under the idempotent producer too). Returns the batches
        dropped."""
        accumulator = getattr(self._producer, "_message_accumulator", None)
        queues = getattr(accumulator, "_batches", None)
        if not isinstance(queues, dict):
            return 0
        dropped = 0
        for tp in [tp for tp in queues if getattr(tp, "topic", None) == self._cfg.results_topic]:
            queue = queues.pop(tp)
            while queue:
                batch = queue.popleft()
                batch.drain_ready()
                batch.failure(KafkaError("dropped: this member may have lost its partitions"))
                dropped += 1
        return dropped

    async def flush(self, source_partition: int, timeout_seconds: float) -> bool:
        """Submit what is open, stop ``source_partition``'s resends, wait for every send to settle."""
        for task in list(self._retries.pop(source_partition, ())):
            task.cancel()
        for partition in list(self._open):
            self._ship(partition)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_seconds
        # A batch that completes hands the next waiting one to the producer (in its done callback,
        # before this wait returns), so this goes on until nothing is waiting or sending.
        while self._sending:
            remaining = deadline - loop.time()
            if remaining <= 0:
                return False
            await asyncio.wait(set(self._sending), timeout=remaining)
        return await flush_producer(self._producer, max(0.0, deadline - loop.time()))

    def health(self) -> tuple[bool, str]:
        return self.write_health.status()

    async def append(self, source_partition: int, conversation_id: str, record: ResultRecord) -> int:
        """Submit and wait for the acknowledgement."""
        return await (await self.submit(source_partition, conversation_id, record))
