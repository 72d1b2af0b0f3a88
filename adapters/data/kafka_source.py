"""Conversations from a Kafka topic of contract-v1 events (what the sidecar itself consumes).

``kafka://HOST:PORT[,HOST:PORT]/TOPIC`` reads a plaintext cluster; ``kafka:`` (or ``kafka:TOPIC``)
with ``--sidecar-config FILE`` uses that sidecar's brokers, TLS/SASL settings and (by default)
source topic. The topic is read from the beginning to the end offsets it had when reading started,
without a consumer group (nothing is committed, the sidecar's group is untouched). Every record
goes through the sidecar's own decoder (``sidecar.events.decode_event``); undecodable ones are
counted as malformed. A conversation is kept when it ended (a ``conversation_end`` event), its
``seq`` runs 0..n without a gap, and, with an agent given, its events carry that agent. Message
text is held in memory only up to ``max_total_bytes`` of record values.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import structlog

from adapters.data.conversations import Conversation, stats_json
from adapters.errors import DataError
from sidecar.errors import DecodeError
from sidecar.events import Event, decode_event
from sidecar.kafka_clients import plaintext_client_kwargs
from sidecar.transcript.dataset import ReadLimits, ReadStats

if TYPE_CHECKING:
    from sidecar.config import SidecarConfig

log = structlog.get_logger()

MAX_RECORD_BYTES = 8 * 1024 * 1024
_POLL_MS = 1000
_IDLE_POLLS = 10


def connection(
    spec: str, scheme: str, sidecar_config: Path | None, default_topic: Callable[[SidecarConfig], str]
) -> tuple[dict[str, Any], str]:
    """The client keywords and topic of ``SCHEME://HOST:PORT[,HOST:PORT]/TOPIC`` (plaintext) or
    ``SCHEME:[TOPIC]`` with the sidecar's config file (its brokers, TLS and SASL; ``default_topic``
    of that config when no topic is named)."""
    rest = spec.removeprefix(f"{scheme}:")
    if rest.startswith("//"):
        parts = urlsplit(spec)
        topic = parts.path.strip("/")
        if not parts.netloc or not topic:
            raise DataError(f"bad Kafka source {spec!r}: use {scheme}://HOST:PORT[,HOST:PORT]/TOPIC")
        return plaintext_client_kwargs(parts.netloc), topic
    if sidecar_config is None:
        raise DataError(f"a '{scheme}:' source needs --sidecar-config (or use {scheme}://HOST:PORT/TOPIC)")
    from sidecar.config import load_config
    from sidecar.errors import ConfigError
    from sidecar.kafka_clients import client_kwargs

    try:
        cfg = load_config(sidecar_config)
    except ConfigError as exc:
        raise DataError(str(exc)) from exc
    return client_kwargs(cfg.kafka), rest.strip("/") or default_topic(cfg)


async def read_topic(
    client: dict[str, Any], topic: str, take: Callable[[Any], None], *, until_quiet: bool = False
) -> None:
    """Hand every record of ``topic`` (all partitions, from the beginning) to ``take``, up to the end
    offsets the topic had when reading started, without a consumer group. ``until_quiet``: then
    go on until one poll comes back empty (a broker that answers a low end offset, Tansu, still
    gives its last batch whole). Raises :class:`DataError` for an unreachable cluster or a
    missing topic."""
    from aiokafka import AIOKafkaConsumer, TopicPartition
    from aiokafka.errors import KafkaError

    consumer = AIOKafkaConsumer(
        **client,
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        max_partition_fetch_bytes=MAX_RECORD_BYTES,
    )
    where = f"{client.get('bootstrap_servers')}/{topic}"
    try:
        await consumer.start()
    except KafkaError as exc:
        raise DataError(f"cannot reach Kafka at {where}: {type(exc).__name__}") from exc
    try:
        # ``topics()`` fetches fresh metadata but leaves the consumer's own copy, which
        # ``partitions_for_topic`` reads, as it was: refresh that one (aiokafka has no public call).
        await consumer._client.force_metadata_update()
        parts = consumer.partitions_for_topic(topic)
        if not parts:
            raise DataError(f"Kafka topic {topic!r} not found at {where}")
        tps = [TopicPartition(topic, p) for p in sorted(parts)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        end = await consumer.end_offsets(tps)
        await _drain(consumer, tps, end, take)
        while until_quiet:
            batch = await consumer.getmany(timeout_ms=_POLL_MS, max_records=5000)
            until_quiet = bool(batch)
            for records in batch.values():
                for rec in records:
                    take(rec)
    finally:
        await consumer.stop()


async def _drain(consumer: Any, tps: list[Any], end: dict[Any, int], take: Callable[[Any], None]) -> None:
    idle = 0
    while idle < _IDLE_POLLS:
        positions = [await consumer.position(tp) for tp in tps]
        if all(pos >= end[tp] for pos, tp in zip(positions, tps, strict=True)):
            break
        batch = await consumer.getmany(timeout_ms=_POLL_MS, max_records=5000)
        idle = 0 if batch else idle + 1
        for records in batch.values():
            for rec in records:
                take(rec)


@dataclass
class _Pending:
    agent: str | None
    events: dict[int, Event] = field(default_factory=dict)
    ended_at: int | None = None


@dataclass
class KafkaSource:
    """Finished conversations of one agent (or all) from a topic of v1 events."""

    name: str
    client: dict[str, Any]
    topic: str
    agent: str | None
    limits: ReadLimits = field(default_factory=ReadLimits)
    stats: ReadStats = field(default_factory=ReadStats)
    counts: dict[str, int] = field(default_factory=dict)

    @classmethod
    def from_spec(
        cls, name: str, spec: str, *, agent: str | None, limits: ReadLimits, sidecar_config: Path | None
    ) -> KafkaSource:
        client, topic = connection(spec, "kafka", sidecar_config, lambda cfg: cfg.kafka.topic)
        return cls(name, client, topic, agent, limits)

    def describe(self) -> dict[str, Any]:
        servers = self.client.get("bootstrap_servers", "")
        return {
            "name": self.name,
            "kind": "kafka",
            "location": f"{servers}/{self.topic}",
            "agent": self.agent,
            **stats_json(self.stats),
            "conversations_skipped": dict(sorted(self.counts.items())),
        }

    def conversations(self) -> Iterator[Conversation]:
        pending = asyncio.run(self._read())
        for cid, conv in pending.items():
            built = self._build(cid, conv)
            if built is not None:
                self.stats.records += 1
                yield built
                cap = self.limits.max_records
                if cap is not None and self.stats.records >= cap:
                    return

    def _skip(self, reason: str) -> None:
        self.counts[reason] = self.counts.get(reason, 0) + 1

    def _build(self, cid: str, conv: _Pending) -> Conversation | None:
        if self.agent is not None and conv.agent != self.agent:
            self._skip("other_agent")
            return None
        if conv.ended_at is None:
            self._skip("not_ended")
            return None
        if sorted(conv.events) != list(range(conv.ended_at)):
            self._skip("seq_gap")
            return None
        messages = tuple(conv.events[i].message for i in range(conv.ended_at))
        if not messages or any(m is None for m in messages):
            self._skip("empty")
            return None
        return Conversation(cid, conv.agent or "default", cid, tuple(m for m in messages if m is not None))

    async def _read(self) -> dict[str, _Pending]:
        pending: dict[str, _Pending] = {}
        await read_topic(self.client, self.topic, lambda rec: self._take(pending, rec))
        return pending

    def _take(self, pending: dict[str, _Pending], rec: Any) -> None:
        self.stats.lines += 1
        self.stats.bytes += len(rec.value or b"")
        if self.stats.bytes > self.limits.max_total_bytes:
            raise DataError(
                f"Kafka topic {self.topic!r}: more than {self.limits.max_total_bytes} bytes of events; "
                "raise --max-input-bytes"
            )
        try:
            ev = decode_event(rec.value, rec.key, max_bytes=MAX_RECORD_BYTES)
        except DecodeError as exc:
            self.stats.skip(exc.reason)
            return
        if ev.type == "feedback":  # a person's judgement, not part of any transcript (nor malformed)
            return
        conv = pending.get(ev.conversation_id)
        if conv is None:
            conv = pending[ev.conversation_id] = _Pending(ev.agent)
        if ev.type == "conversation_end":
            conv.ended_at = ev.seq
        elif ev.seq not in conv.events:
            conv.events[ev.seq] = ev
