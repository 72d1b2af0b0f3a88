"""``CompactedTable``: every replica's copy of a table kept in a compacted Kafka topic.

State that must be the same on every replica (the goal model, the agent -> adapter routing) is
written to a compacted topic, one key per row, and every replica follows the topic from its
beginning: a GlobalKTable in Kafka Streams' terms. Nothing else is needed to share it, and a
restarted or new replica rebuilds it by reading the topic again.

Guarantees:

* **Caught up.** :attr:`caught_up` turns true once every partition has been read up to the end
  offsets taken when the table started (what existed then is applied); ``/readyz`` names a table
  that is not caught up yet. After that the table follows new records as they come.
* **Untrusted input.** The topic can hold anything: a record whose value does not decode, or whose
  key is not UTF-8, is skipped and counted (``invalid``), never raised.
* **Fenced rows.** A row is replaced only when the table's ``accept(current, new)`` says so
  (:func:`fenced`: a higher writer generation, or the same generation and a higher version):
  records of a writer that lost its role and woke up late are counted as ``stale`` and ignored,
  whatever their position in the topic. A tombstone (empty value) deletes a row.
* **Bounded.** At most ``max_rows`` rows (a key beyond that is skipped as ``full``) and records of
  at most ``max_record_bytes``.

Changes are announced to the callbacks given to :meth:`subscribe`, on the event loop, in topic order
per partition; a callback that raises is logged and counted, and the table goes on.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import ClassVar, Final, Generic, Protocol, TypeVar

import structlog
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaError
from prometheus_client import CollectorRegistry, Counter, Gauge

from sidecar.kafka_clients import client_kwargs
from sidecar.lifecycle import Health
from sidecar.retry import Backoff
from sidecar.source.config import KafkaConfig
from sidecar.supervision import Supervised, spawn

log = structlog.get_logger(__name__)

POLL_TIMEOUT_MS: Final = 500
BACKOFF_INITIAL_SECONDS: Final = 0.2
BACKOFF_MAX_SECONDS: Final = 10.0


class Fenced(Protocol):
    """What a row of a fenced table carries: who wrote it (the writer's election generation) and
    the writer's own counter."""

    @property
    def generation(self) -> int: ...

    @property
    def version(self) -> int: ...


F = TypeVar("F", bound=Fenced)
T = TypeVar("T")


def fenced(current: F | None, new: F) -> bool:
    """Accept ``new`` over ``current``: a higher generation wins; within one generation a higher
    version. A writer of an older generation (a leader that was paused past its session timeout
    while a successor took over) can never replace a row its successor wrote."""
    if current is None:
        return True
    return (new.generation, new.version) > (current.generation, current.version)


class InvalidRow(ValueError):
    """A record's value is not a valid row (the decoder's one error)."""


@dataclass(frozen=True, slots=True)
class Change(Generic[T]):
    """A row replaced (``value`` set) or deleted (``value`` None)."""

    key: str
    value: T | None


class TableMetrics:
    """``sidecar_fleet_table_*``: one family per process, the table's name as a label (``on``)."""

    _per_registry: ClassVar[weakref.WeakKeyDictionary[CollectorRegistry, TableMetrics]] = weakref.WeakKeyDictionary()

    @classmethod
    def on(cls, registry: CollectorRegistry) -> TableMetrics:
        """The families on ``registry``, created by the first table that asks (every table shares them)."""
        metrics = cls._per_registry.get(registry)
        if metrics is None:
            metrics = cls._per_registry[registry] = cls(registry)
        return metrics

    def __init__(self, registry: CollectorRegistry) -> None:
        self.records = Counter(
            "sidecar_fleet_table_records_total",
            "Records read from a fleet table's compacted topic, by what became of them "
            "(applied, stale: an older writer's, invalid, full: over the row bound).",
            ["table", "outcome"],
            registry=registry,
        )
        self.rows = Gauge("sidecar_fleet_table_rows", "Rows a fleet table holds.", ["table"], registry=registry)
        self.caught_up = Gauge(
            "sidecar_fleet_table_caught_up",
            "1 once a fleet table has read its topic up to where it was when the replica started.",
            ["table"],
            registry=registry,
        )
        self.callback_errors = Counter(
            "sidecar_fleet_table_callback_errors_total",
            "Change callbacks of a fleet table that raised (logged; the table goes on).",
            ["table"],
            registry=registry,
        )


class CompactedTable(Generic[T]):
    """Follow ``topic`` from its beginning; the latest accepted row per key.

    ``decode(value) -> T`` raises :class:`InvalidRow` for a bad record; ``accept(current, new)``
    decides whether a row replaces the current one (default: always, the newest in topic order).
    """

    def __init__(
        self,
        name: str,
        topic: str,
        kafka: KafkaConfig,
        decode: Callable[[bytes], T],
        metrics: TableMetrics,
        *,
        accept: Callable[[T | None, T], bool] | None = None,
        max_rows: int = 10_000,
        max_record_bytes: int = 4 * 1_048_576,
    ) -> None:
        self.name = name
        self.topic = topic
        self._kafka = kafka
        self._decode = decode
        self._accept = accept or (lambda _current, _new: True)
        self._metrics = metrics
        self._max_rows = max_rows
        self._max_record_bytes = max_record_bytes
        self._rows: dict[str, T] = {}
        self._callbacks: list[Callable[[Change[T]], None]] = []
        self._caught_up = asyncio.Event()
        self._task: Supervised | None = None
        self._error = ""
        metrics.caught_up.labels(name).set(0)

    # -- reading -------------------------------------------------------------------------------

    def get(self, key: str) -> T | None:
        return self._rows.get(key)

    def items(self) -> Iterator[tuple[str, T]]:
        return iter(list(self._rows.items()))

    def __len__(self) -> int:
        return len(self._rows)

    @property
    def caught_up(self) -> bool:
        return self._caught_up.is_set()

    async def wait_caught_up(self) -> None:
        await self._caught_up.wait()

    def subscribe(self, callback: Callable[[Change[T]], None]) -> None:
        """Call ``callback`` for every change from now on (rows already held are not replayed)."""
        self._callbacks.append(callback)

    # -- lifecycle -----------------------------------------------------------------------------

    async def start(self) -> None:
        if self._task is None:
            self._task = spawn(f"table-{self.name}", self._run)

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            await task.stop()

    def health(self) -> Health:
        if self._task is not None and self._task.death is not None:
            return Health(f"table-{self.name}", False, f"task {self._task.death}")
        if self.caught_up:
            return Health(f"table-{self.name}", True, f"{len(self._rows)} rows")
        detail = "reading the topic" + (f" ({self._error})" if self._error else "")
        return Health(f"table-{self.name}", False, detail)

    async def _run(self) -> None:
        backoff = Backoff(BACKOFF_INITIAL_SECONDS, BACKOFF_MAX_SECONDS)
        positions: dict[TopicPartition, int] = {}
        while True:
            consumer = AIOKafkaConsumer(
                **client_kwargs(self._kafka, client_id=f"{self._kafka.client_id}-table-{self.name}"),
                group_id=None,
                enable_auto_commit=False,
                auto_offset_reset="earliest",
                isolation_level="read_committed",
                max_partition_fetch_bytes=max(1_048_576, self._max_record_bytes + 65_536),
                fetch_max_bytes=max(1_048_576, self._max_record_bytes + 65_536),
            )
            try:
                await consumer.start()
                await self._follow(consumer, positions)
            except KafkaError as exc:
                self._error = type(exc).__name__
                delay = backoff.delay()
                log.warning("fleet.table_error", table=self.name, error=self._error, retry_in_seconds=round(delay, 2))
                await asyncio.sleep(delay)
            finally:
                await consumer.stop()

    async def _follow(self, consumer: AIOKafkaConsumer, positions: dict[TopicPartition, int]) -> None:
        """Read from where the last attempt stopped (the beginning at first), forever."""
        partitions = await self._partitions(consumer)
        consumer.assign(partitions)
        for tp in partitions:
            if tp in positions:
                consumer.seek(tp, positions[tp])
            else:
                await consumer.seek_to_beginning(tp)
        if not self.caught_up:
            ends = await consumer.end_offsets(partitions)
            behind = {tp for tp in partitions if ends[tp] > await consumer.position(tp)}
        else:
            ends, behind = {}, set()
        if not behind:
            self._mark_caught_up()
        while True:
            batch = await consumer.getmany(timeout_ms=POLL_TIMEOUT_MS)
            for tp, records in batch.items():
                for rec in records:
                    self._apply(rec.key, rec.value)
                    positions[tp] = rec.offset + 1
                if tp in behind and positions.get(tp, 0) >= ends[tp]:
                    behind.discard(tp)
                    if not behind:
                        self._mark_caught_up()

    async def _partitions(self, consumer: AIOKafkaConsumer) -> list[TopicPartition]:
        parts = consumer.partitions_for_topic(self.topic)
        if not parts:
            await consumer._client.force_metadata_update()
            parts = consumer.partitions_for_topic(self.topic)
        if not parts:
            raise TopicMissing(self.topic)
        return [TopicPartition(self.topic, p) for p in sorted(parts)]

    def _mark_caught_up(self) -> None:
        if not self.caught_up:
            self._caught_up.set()
            self._error = ""
            self._metrics.caught_up.labels(self.name).set(1)
            log.info("fleet.table_caught_up", table=self.name, rows=len(self._rows))

    # -- applying ------------------------------------------------------------------------------

    def _apply(self, raw_key: bytes | None, value: bytes | None) -> None:
        outcome = self._row(raw_key, value)
        self._metrics.records.labels(self.name, outcome).inc()
        self._metrics.rows.labels(self.name).set(len(self._rows))

    def _row(self, raw_key: bytes | None, value: bytes | None) -> str:
        key = _key(raw_key)
        if key is None:
            return "invalid"
        if not value:  # a tombstone
            if self._rows.pop(key, None) is not None:
                self._announce(Change(key, None))
            return "applied"
        row = self._decoded(value)
        if row is None:
            return "invalid"
        current = self._rows.get(key)
        if current is None and len(self._rows) >= self._max_rows:
            return "full"
        if not self._accept(current, row):
            return "stale"
        self._rows[key] = row
        self._announce(Change(key, row))
        return "applied"

    def _decoded(self, value: bytes) -> T | None:
        if len(value) > self._max_record_bytes:
            return None
        try:
            return self._decode(value)
        except InvalidRow:
            return None

    def _announce(self, change: Change[T]) -> None:
        for callback in self._callbacks:
            try:
                callback(change)
            except Exception as exc:  # a consumer's bug must not stop the table for the others
                self._metrics.callback_errors.labels(self.name).inc()
                log.exception("fleet.table_callback_failed", table=self.name, error=type(exc).__name__)


def _key(raw: bytes | None) -> str | None:
    """A row key: non-empty UTF-8, else None."""
    try:
        key = (raw or b"").decode("utf-8")
    except UnicodeDecodeError:
        return None
    return key or None


class TopicMissing(KafkaError):  # type: ignore[misc]
    """The table's topic does not exist (yet): retried like any Kafka error."""

    retriable = True

    def __init__(self, topic: str) -> None:
        super().__init__(f"topic {topic} does not exist")
