"""``FleetGoals``: one goal model for every replica, shared through two Kafka topics.

With ``clustering.fleet.enabled`` (docs/fleet.md, "The goal model"):

* **Inputs.** The replica that ends a conversation writes its goal summary and unit embedding to
  the inputs topic (a bounded queue and one writer task: a full queue or a failed write drops the
  input and counts it; clustering works on a sample anyway). Every replica follows the topic, from
  the last ``reservoir_size`` records of each partition on, into its own reservoir, so whoever
  leads next already holds the fleet's recent conversations.
* **The model.** Only the leader (the owner of source partition 0, :mod:`sidecar.fleet.leadership`)
  re-clusters. It writes the result, with ids matched to the current model's, as one row of a
  compacted topic, stamped with its term's generation and a version. Every replica, the leader
  included, applies the model it reads back (:class:`~sidecar.fleet.table.CompactedTable`,
  fenced): goal ids, names and ``sidecar_goal_info`` are the same on every replica, and a leader
  paused past its session timeout cannot replace its successor's model when it wakes up. A leader
  that reads a model of a newer generation than its own steps down.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Final

import structlog
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaError
from prometheus_client import CollectorRegistry

from sidecar.clustering.config import ClusteringConfig
from sidecar.clustering.metrics import FleetGoalMetrics
from sidecar.clustering.records import (
    FleetGoalModel,
    GoalInput,
    Published,
    decode_input,
    decode_model,
    encode_input,
    encode_model,
)
from sidecar.fleet.leadership import Leadership
from sidecar.fleet.publisher import PublishFailed, TablePublisher
from sidecar.fleet.table import Change, CompactedTable, InvalidRow, TableMetrics, TopicMissing, fenced
from sidecar.fleet.topics import ensure_compacted_topic
from sidecar.kafka_clients import client_kwargs
from sidecar.lifecycle import Health
from sidecar.retry import Backoff
from sidecar.source.config import KafkaConfig
from sidecar.supervision import Supervised, spawn

log = structlog.get_logger(__name__)

MODEL_KEY: Final = "model"
MAX_MODEL_BYTES: Final = 16 * 1_048_576
MAX_INPUT_BYTES: Final = 256 * 1024
POLL_TIMEOUT_MS: Final = 500


class FleetGoals:
    """Component: the model table, the inputs writer and the inputs follower."""

    name = "goal-fleet"

    def __init__(
        self,
        config: ClusteringConfig,
        kafka: KafkaConfig,
        registry: CollectorRegistry,
        leadership: Leadership,
        *,
        on_input: Callable[[GoalInput], None],
        on_model: Callable[[FleetGoalModel], None],
        table_metrics: TableMetrics | None = None,
    ) -> None:
        self._cfg = config.fleet
        self._reservoir_size = config.reservoir_size
        self._kafka = kafka
        self._leadership = leadership
        self._on_input = on_input
        self._on_model = on_model
        self.metrics = FleetGoalMetrics(registry)
        self.model_topic, self.inputs_topic = self._cfg.topics(kafka.topic)
        self.table: CompactedTable[FleetGoalModel] = CompactedTable(
            "goals",
            self.model_topic,
            kafka,
            decode_model,
            table_metrics or TableMetrics.on(registry),
            accept=fenced,
            max_rows=1,
            max_record_bytes=MAX_MODEL_BYTES,
        )
        self.table.subscribe(self._changed)
        self._model_out = TablePublisher(self.model_topic, kafka)
        self._inputs_out = TablePublisher(self.inputs_topic, kafka)
        self._queue: asyncio.Queue[GoalInput] = asyncio.Queue(self._cfg.write_queue_size)
        self._tasks: list[Supervised] = []
        self._follow_error = ""
        self._written = (0, 0)  # (generation, version) of the last model this replica wrote

    # -- lifecycle -----------------------------------------------------------------------------

    async def start(self) -> None:
        if not self._tasks:
            await self.table.start()
            self._tasks = [spawn("goal-fleet-writer", self._write_loop), spawn("goal-fleet-inputs", self._follow_loop)]

    async def stop(self) -> None:
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            await task.stop()
        await self.table.stop()
        await self._model_out.stop()
        await self._inputs_out.stop()

    def health(self) -> Health:
        """Never gates: says whether this replica has read the fleet's model yet."""
        model = self.table.get(MODEL_KEY)
        if model is None:
            state = "reading the model topic" if not self.table.caught_up else "no fleet goal model yet"
            detail = state + (f" (inputs: {self._follow_error})" if self._follow_error else "")
            return Health("goal-fleet", True, detail)
        return Health(
            "goal-fleet",
            True,
            f"model generation={model.generation} version={model.version}, {len(model.clusters)} goals",
        )

    # -- inputs --------------------------------------------------------------------------------

    def write_input(self, item: GoalInput) -> None:
        """Queue one input for the inputs topic (dropped and counted when the queue is full)."""
        try:
            self._queue.put_nowait(item)
        except asyncio.QueueFull:
            self.metrics.inputs.labels("dropped").inc()

    async def _write_loop(self) -> None:
        if self._cfg.create_topics:
            retention = {"cleanup.policy": "delete", "retention.ms": str(self._cfg.inputs_retention_ms)}
            rf = self._cfg.replication_factor
            await ensure_compacted_topic(self._kafka, self.inputs_topic, replication_factor=rf, configs=retention)
            await ensure_compacted_topic(self._kafka, self.model_topic, replication_factor=rf)
        while True:
            item = await self._queue.get()
            value = encode_input(item)
            if len(value) > MAX_INPUT_BYTES:
                self.metrics.inputs.labels("dropped").inc()
                continue
            try:
                await self._inputs_out.publish(
                    item.conversation_id, value, timeout_seconds=self._cfg.write_timeout_seconds
                )
            except PublishFailed as exc:
                self.metrics.inputs.labels("write_error").inc()
                log.warning("goal_fleet.input_write_failed", error=str(exc))
                continue
            self.metrics.inputs.labels("written").inc()

    async def _follow_loop(self) -> None:
        backoff = Backoff(0.2, 10.0)
        positions: dict[TopicPartition, int] = {}
        while True:
            consumer = AIOKafkaConsumer(
                **client_kwargs(self._kafka, client_id=f"{self._kafka.client_id}-goal-inputs"),
                group_id=None,
                enable_auto_commit=False,
                auto_offset_reset="earliest",
                isolation_level="read_committed",
                max_partition_fetch_bytes=max(1_048_576, 2 * MAX_INPUT_BYTES),
            )
            try:
                await consumer.start()
                await self._follow(consumer, positions)
            except KafkaError as exc:
                self._follow_error = type(exc).__name__
                await asyncio.sleep(backoff.delay())
            finally:
                await consumer.stop()

    async def _follow(self, consumer: AIOKafkaConsumer, positions: dict[TopicPartition, int]) -> None:
        parts = consumer.partitions_for_topic(self.inputs_topic)
        if not parts:
            await consumer._client.force_metadata_update()
            parts = consumer.partitions_for_topic(self.inputs_topic)
        if not parts:
            raise TopicMissing(self.inputs_topic)
        partitions = [TopicPartition(self.inputs_topic, p) for p in sorted(parts)]
        consumer.assign(partitions)
        fresh = [tp for tp in partitions if tp not in positions]
        if fresh:  # the recent past: enough to fill the reservoir, not the whole retention
            starts = await consumer.beginning_offsets(fresh)
            ends = await consumer.end_offsets(fresh)
            for tp in fresh:
                positions[tp] = max(starts[tp], ends[tp] - self._reservoir_size)
        for tp in partitions:
            consumer.seek(tp, positions[tp])
        self._follow_error = ""
        while True:
            batch = await consumer.getmany(timeout_ms=POLL_TIMEOUT_MS)
            for tp, records in batch.items():
                for rec in records:
                    positions[tp] = rec.offset + 1
                    self._read_input(rec.value)

    def _read_input(self, value: bytes | None) -> None:
        if value is None or len(value) > MAX_INPUT_BYTES:
            self.metrics.inputs.labels("invalid").inc()
            return
        try:
            item = decode_input(value)
        except InvalidRow:
            self.metrics.inputs.labels("invalid").inc()
            return
        self.metrics.inputs.labels("read").inc()
        self._on_input(item)

    # -- the model -----------------------------------------------------------------------------

    @property
    def last_written(self) -> tuple[int, int]:
        """(generation, version) of the last model this replica wrote; (0, 0) before any."""
        return self._written

    @property
    def leading(self) -> bool:
        return self._leadership.term is not None

    async def publish_model(self, plan: FleetGoalModel) -> Published:
        """As the leader, write ``plan`` (ids already matched) under this term: ``published``, or
        ``not_leader`` when this replica does not lead (any more: a correct step-down), or
        ``publish_error`` when the write was not acknowledged."""
        term = self._leadership.term
        if term is None:
            self.metrics.models.labels("not_leader").inc()
            return "not_leader"
        current = self.table.get(MODEL_KEY)
        if current is not None and current.generation > term.generation:
            self._leadership.superseded(current.generation)
            self.metrics.models.labels("not_leader").inc()
            return "not_leader"
        # Versions count on from what this term wrote or read, whichever is further: a run that follows
        # another before its model was read back must not repeat its version (it would be stale).
        version = 0
        for generation, seen in (self._written, (current.generation, current.version) if current else (0, 0)):
            if generation == term.generation:
                version = max(version, seen)
        row = FleetGoalModel(term.generation, version + 1, plan.prefix, plan.next_number, plan.clusters)
        try:
            timeout = self._cfg.write_timeout_seconds
            await self._model_out.publish(MODEL_KEY, encode_model(row), timeout_seconds=timeout)
        except PublishFailed as exc:
            self.metrics.models.labels("publish_error").inc()
            log.warning("goal_fleet.model_write_failed", error=str(exc))
            return "publish_error"
        self._written = (row.generation, row.version)
        self.metrics.models.labels("published").inc()
        log.info("goal_fleet.model_published", generation=row.generation, version=row.version, goals=len(row.clusters))
        await self._read_back(row)
        return "published"

    async def _read_back(self, row: FleetGoalModel) -> None:
        """Wait (at most the write timeout) until this replica applied ``row`` or a newer model: the
        next run then matches ids against it and counts on from its id counter."""
        deadline = asyncio.get_running_loop().time() + self._cfg.write_timeout_seconds
        while asyncio.get_running_loop().time() < deadline:
            current = self.table.get(MODEL_KEY)
            if current is not None and (current.generation, current.version) >= (row.generation, row.version):
                return
            await asyncio.sleep(0.05)
        log.warning("goal_fleet.model_not_read_back", generation=row.generation, version=row.version)

    def _changed(self, change: Change[FleetGoalModel]) -> None:
        model = change.value
        if change.key != MODEL_KEY or model is None:
            return
        self._leadership.superseded(model.generation)
        self.metrics.models.labels("applied").inc()
        self._on_model(model)
