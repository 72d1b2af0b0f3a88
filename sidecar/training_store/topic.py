"""``KafkaTrainingStoreSink``: finished conversations of the whole fleet in one compacted topic.

The kafka backend of the training store. On each ``conversation_ended`` effect that counts as
finished (``end_reasons``, ``min_user_turns``, ``agents``: the same selection as the file backend),
one record is written to the training topic:

* key ``<agent>/<conversation_id>`` (UTF-8): a conversation's key never changes, so a repeat (the
  post-score stage delivers effects at least once: a replica that crashed before its journal write,
  a partition handed over, a producer retry) replaces the record instead of adding one. Log
  compaction keeps the newest record per key, and ``adapters onboard --source kafka-training:...``
  keeps one conversation per key before compaction has run;
* value: the JSON conversation the file store writes (:func:`~sidecar.training_store.sink.conversation_record`),
  from the state's own copy of the messages, so already redacted when ``state.redaction`` is on.
  A value over ``max_record_bytes`` is counted (``too_large``) and not written: never cut.

The topic is created compacted with one partition when missing (``create_topic``). Its size is
bounded by the topic's own retention and compaction; readers keep the newest N per agent.

The effect waits for the brokers' acknowledgement, at most ``write_timeout_seconds``: a
conversation whose effect is in the results journal is in the topic. Past that, or on a Kafka
error, the write is counted as ``error``, logged, shown on ``/readyz``, and the effect goes on: the
store is best effort and must never stall the pipeline. Logs and metrics carry no text.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Protocol

import structlog
from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError
from prometheus_client import CollectorRegistry

from sidecar.contract import Effect
from sidecar.fleet.topics import ensure_compacted_topic
from sidecar.kafka_clients import client_kwargs, durable_producer_kwargs
from sidecar.lifecycle import Health
from sidecar.source.config import KafkaConfig
from sidecar.telemetry.labels import AgentLabels
from sidecar.training_store.config import TrainingStoreConfig
from sidecar.training_store.sink import TrainingStoreMetrics, admitted, conversation_record

log = structlog.get_logger(__name__)

_REMEMBERED_KEYS = 20_000
# A refused or failed topic creation is tried again at most this often (the cluster may have been
# down, or the operator may create the topic meanwhile); writes go on in between.
_TOPIC_RETRY_SECONDS = 60.0
# Room for the record's key, headers and batch framing above the value.
_REQUEST_OVERHEAD_BYTES = 65_536


class Producer(Protocol):
    """What the sink needs of an aiokafka producer (a fake in tests)."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def send_and_wait(self, topic: str, value: bytes | None = None, key: bytes | None = None) -> object: ...


def record_key(agent: str, conversation_id: str) -> bytes:
    """The record's key: one per conversation, the agent first so a reader filters without parsing."""
    return f"{agent}/{conversation_id}".encode()


def make_training_producer(kafka: KafkaConfig, max_record_bytes: int) -> AIOKafkaProducer:
    """The sidecar's connection and durability settings; requests large enough for one full record."""
    return AIOKafkaProducer(
        **client_kwargs(kafka, client_id=f"{kafka.client_id}-training"),
        **durable_producer_kwargs(kafka),
        linger_ms=5,
        max_request_size=max_record_bytes + _REQUEST_OVERHEAD_BYTES,
    )


class KafkaTrainingStoreSink:
    """An :class:`~sidecar.stage.pipeline.OutcomeSink`, a component and a health reporter.

    ``start()`` returns at once: the producer connects with the first write, within that write's
    timeout, so a replica starts while Kafka is down."""

    name = "training_store"

    def __init__(
        self,
        config: TrainingStoreConfig,
        kafka: KafkaConfig,
        registry: CollectorRegistry,
        labels: AgentLabels,
        *,
        redacted: bool,
        producer_factory: Callable[[], Producer] | None = None,
        create_topic: Callable[[], Awaitable[bool]] | None = None,
    ) -> None:
        self._cfg = config
        self.topic = config.topic_for(kafka.topic)
        self._labels = labels
        self._redacted = redacted
        self.metrics = TrainingStoreMetrics(registry)
        self._factory = producer_factory or (lambda: make_training_producer(kafka, config.max_record_bytes))
        self._create_topic = create_topic or (
            lambda: ensure_compacted_topic(kafka, self.topic, replication_factor=config.replication_factor)
        )
        self._topic_ok = not config.create_topic
        self._topic_tried_at: float | None = None
        self._producer: Producer | None = None
        self._starting = asyncio.Lock()
        self._written: OrderedDict[bytes, None] = OrderedDict()
        self._agents: set[str] = set()
        self._selected = frozenset(config.agents)
        self._last_error = ""
        self._count = 0
        self._stopped = False

    async def start(self) -> None:
        """Nothing to wait for: the producer starts with the first write."""
        self._stopped = False

    async def stop(self) -> None:
        self._stopped = True
        async with self._starting:
            producer, self._producer = self._producer, None
        if producer is not None:
            await producer.stop()  # flushes what is in flight; its effects are waiting on it

    def health(self) -> Health:
        if self._last_error:
            return Health(self.name, False, f"last write to {self.topic} failed: {self._last_error}")
        return Health(self.name, True, f"{self._count} conversations written to {self.topic} by this replica")

    def offer(self, effect: Effect) -> Awaitable[None] | None:
        ctx = effect.ctx
        agent = admitted(ctx, self._cfg, self._selected, self.metrics, self._labels)
        if agent is None:
            return None
        label = self._labels(ctx.agent)
        key = record_key(agent, ctx.conversation_id)
        if key in self._written:
            self._count_result(label, "duplicate")
            return None
        if not self._selected and len(self._agents) >= self._cfg.max_agents and agent not in self._agents:
            self._count_result(label, "agent_limit")
            return None
        value = json.dumps(conversation_record(ctx, agent, self._redacted), ensure_ascii=False).encode()
        if len(value) > self._cfg.max_record_bytes:
            self._count_result(label, "too_large")
            return None
        return self._write(key, value, agent, label)

    def _count_result(self, label: str, result: str) -> None:
        self.metrics.conversations.labels(label, result).inc()

    async def _write(self, key: bytes, value: bytes, agent: str, label: str) -> None:
        """Write and wait for the acknowledgement; never raises but for cancellation."""
        timeout = self._cfg.write_timeout_seconds
        try:
            async with asyncio.timeout(timeout):
                producer = await self._ready()
                await producer.send_and_wait(self.topic, value=value, key=key)
        except TimeoutError:
            self._failed(label, f"no acknowledgement within {timeout:g}s")
            return
        except KafkaError as exc:
            self._failed(label, type(exc).__name__)
            return
        self._last_error = ""
        self._count += 1
        self._agents.add(agent)
        self._written[key] = None
        while len(self._written) > _REMEMBERED_KEYS:
            self._written.popitem(last=False)
        self._count_result(label, "written")

    def _failed(self, label: str, reason: str) -> None:
        self._last_error = reason
        self._count_result(label, "error")
        log.error("training_store.write_failed", agent=label, topic=self.topic, error=reason)

    async def _ready(self) -> Producer:
        async with self._starting:
            if self._stopped:
                raise RuntimeError("KafkaTrainingStoreSink is stopped")
            await self._ensure_topic()
            if self._producer is None:
                producer = self._factory()
                try:
                    await producer.start()
                except BaseException:
                    await producer.stop()  # a producer that failed to start still holds its client
                    raise
                self._producer = producer
            return self._producer

    async def _ensure_topic(self) -> None:
        if self._topic_ok:
            return
        now = time.monotonic()
        if self._topic_tried_at is not None and now - self._topic_tried_at < _TOPIC_RETRY_SECONDS:
            return
        self._topic_tried_at = now
        # False when refused or unreachable (logged there): writing goes on, to a topic the operator
        # made or the brokers create on first write.
        self._topic_ok = await self._create_topic()
