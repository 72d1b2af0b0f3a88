"""Conversations from the sidecar's training topic (``training_store.backend: kafka``).

``kafka-training://HOST:PORT[,HOST:PORT]/TOPIC`` reads a plaintext cluster; ``kafka-training:``
(or ``kafka-training:TOPIC``) with ``--sidecar-config FILE`` uses that sidecar's brokers, TLS/SASL
settings and its training topic (``training_store.topic``, default ``<kafka.topic>.training``).

Every replica of the fleet writes one record per finished conversation, keyed
``<agent>/<conversation_id>``, its value the datasets' JSON schema. The topic is read from the
beginning to its end, without a consumer group (nothing is committed). Per key the newest record
wins (a conversation written twice, by a retry or by two owners around a crash, is read once; a
tombstone removes it), and per agent only the newest ``newest`` conversations are held, so memory
is bounded by that count and by ``max_total_bytes`` of held values. A record that is not one
conversation is counted by reason and skipped: no key or a key that is not ``agent/id``
(``bad_key``), a value over 8 MiB (``oversized``), undecodable JSON (``bad_json``), a value that is
not a conversation (the dataset reader's reasons), or one whose id or agent differs from its key
(``key_mismatch``).
"""

from __future__ import annotations

import asyncio
import json
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from adapters.data.conversations import BadRecordError, Conversation, parse_record, stats_json
from adapters.data.kafka_source import MAX_RECORD_BYTES, connection, read_topic
from adapters.errors import DataError
from sidecar.transcript.dataset import ReadLimits, ReadStats

SCHEME = "kafka-training"
# Agent names follow the event contract (64 characters); conversation ids are bounded there too.
MAX_KEY_BYTES = 1024


@dataclass
class _Held:
    conversation: Conversation
    size: int


@dataclass
class TrainingTopicSource:
    """Finished conversations of one agent (or every agent) from the fleet's training topic."""

    name: str
    client: dict[str, Any]
    topic: str
    agent: str | None
    limits: ReadLimits = field(default_factory=ReadLimits)
    newest: int | None = None
    stats: ReadStats = field(default_factory=ReadStats)
    counts: dict[str, int] = field(default_factory=dict)
    _held: dict[str, OrderedDict[str, _Held]] = field(default_factory=dict, repr=False)
    _held_bytes: int = field(default=0, repr=False)

    @classmethod
    def from_spec(
        cls,
        name: str,
        spec: str,
        *,
        agent: str | None,
        limits: ReadLimits,
        sidecar_config: Path | None,
        newest: int | None = None,
    ) -> TrainingTopicSource:
        client, topic = connection(
            spec, SCHEME, sidecar_config, lambda cfg: cfg.training_store.topic_for(cfg.kafka.topic)
        )
        return cls(name, client, topic, agent, limits, newest)

    def describe(self) -> dict[str, Any]:
        servers = self.client.get("bootstrap_servers", "")
        return {
            "name": self.name,
            "kind": "kafka-training",
            "location": f"{servers}/{self.topic}",
            "agent": self.agent,
            **stats_json(self.stats),
            "conversations_skipped": dict(sorted(self.counts.items())),
        }

    def conversations(self) -> Iterator[Conversation]:
        asyncio.run(read_topic(self.client, self.topic, self.take, until_quiet=True))
        yield from self.held()

    def held(self) -> Iterator[Conversation]:
        """What reading kept, oldest first per agent (each agent's newest ``newest``)."""
        for per_agent in self._held.values():
            for held in per_agent.values():
                self.stats.records += 1
                yield held.conversation

    def _skip(self, reason: str) -> None:
        self.counts[reason] = self.counts.get(reason, 0) + 1

    def take(self, rec: Any) -> None:
        """One record of the topic (anything with ``key`` and ``value`` bytes)."""
        self.stats.lines += 1
        value: bytes | None = rec.value
        self.stats.bytes += len(value or b"")
        key = _split_key(rec.key)
        if key is None:
            self.stats.skip("bad_key")
            return
        agent, cid = key
        if self.agent is not None and agent != self.agent:
            self._skip("other_agent")
            return
        if value is None:  # a tombstone: the conversation was withdrawn
            self._drop(agent, cid)
            return
        conv = self._decode(value)
        if conv is None:
            return
        if conv.conversation_id != cid or conv.dataset != agent:
            self.stats.skip("key_mismatch")
            return
        self._keep(agent, cid, _Held(conv, len(value)))

    def _decode(self, value: bytes) -> Conversation | None:
        """The conversation of a record's value, or None (counted by reason)."""
        if len(value) > MAX_RECORD_BYTES:
            self.stats.skip("oversized")
            return None
        try:
            decoded = json.loads(value)
        except (ValueError, RecursionError):
            self.stats.skip("bad_json")
            return None
        try:
            return parse_record(decoded)
        except BadRecordError as bad:
            self.stats.skip(bad.reason)
            return None

    def _drop(self, agent: str, cid: str) -> None:
        old = self._held.get(agent, OrderedDict()).pop(cid, None)
        if old is not None:
            self._held_bytes -= old.size

    def _keep(self, agent: str, cid: str, held: _Held) -> None:
        if cid in self._held.get(agent, {}):
            self._skip("replaced")  # the same conversation again: the newer record wins
        self._drop(agent, cid)
        per_agent = self._held.setdefault(agent, OrderedDict())
        per_agent[cid] = held
        self._held_bytes += held.size
        while self.newest is not None and len(per_agent) > self.newest:
            _, oldest = per_agent.popitem(last=False)
            self._held_bytes -= oldest.size
            self._skip("older_than_newest")
        if self._held_bytes > self.limits.max_total_bytes:
            flag = self.limits.flag or "max_total_bytes"
            raise DataError(
                f"Kafka topic {self.topic!r}: the conversations kept hold more than {self.limits.max_total_bytes} "
                f"bytes; raise {flag} or keep fewer per agent (--max-conversations)"
            )


def _split_key(key: bytes | None) -> tuple[str, str] | None:
    """``agent/conversation_id`` of a record key, or None for anything else."""
    if key is None or not 3 <= len(key) <= MAX_KEY_BYTES:
        return None
    try:
        text = key.decode("utf-8")
    except UnicodeDecodeError:
        return None
    agent, sep, cid = text.partition("/")
    if not sep or not agent or not cid:
        return None
    return agent, cid
