"""The results topic doubles as the exactly-once journal.

Each hook outcome is one record in the results topic. The committed offset of a source partition
is its *low-watermark* L (first offset of the oldest conversation still open or still owed an
effect) and the commit metadata carries ``p`` (every effect triggered below this offset is recorded)
and ``j`` (the results-topic offset from which this partition's still-relevant outcomes start).

After a restart the partition re-reads the source from L with hooks suppressed below ``p`` and
re-reads the results topic from ``j``: outcomes recorded after the last commit are not produced
again, and time-triggered transitions (idle debounce, idle TTL, eviction) are re-applied at the
position where they first happened, so the rebuilt state is the one the crashed process had.

Journal records come back from a topic that anything with write access can append to: each one
is validated (:mod:`sidecar.source.journal_entry`) and, when signing keys are configured, must
carry a valid signature before it may suppress a hook or end a conversation.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from sidecar.contract import HookKind
from sidecar.source.journal_entry import entry_from_mapping
from sidecar.source.result_record import ResultRecord
from sidecar.state.store import trigger_key

METADATA_VERSION = 1
MAX_OFFSET = 2**63 - 1
# Kafka brokers keep at most offset.metadata.max.bytes (4096 by default) of commit metadata.
MAX_METADATA_CHARS = 4096


class SourceRecord(Protocol):
    """The part of a Kafka consumer record the processor reads."""

    @property
    def topic(self) -> str: ...
    @property
    def partition(self) -> int: ...
    @property
    def offset(self) -> int: ...
    @property
    def key(self) -> bytes | None: ...
    @property
    def value(self) -> bytes | None: ...
    @property
    def timestamp(self) -> int: ...


class ResultsWriter(Protocol):
    """Appends outcomes to the results topic.

    ``submit`` returns once the record is handed to the producer (it waits only when the
    producer's buffer is full) with a future that resolves to the record's offset once the
    brokers acknowledge it (``acks=all``). The writer retries transient failures itself: the
    future never fails, it resolves late.
    """

    async def submit(
        self, source_partition: int, conversation_id: str, record: ResultRecord
    ) -> asyncio.Future[int]: ...

    async def flush(self, source_partition: int, timeout_seconds: float) -> bool:
        """Stop resending ``source_partition``'s failed writes (their futures are cancelled) and
        wait until every write already handed to the producer is acknowledged or failed.

        After it returns True no write submitted for that partition can land later. False: the
        brokers did not answer within ``timeout_seconds``.
        """
        ...


class DeadLetterWriter(Protocol):
    """Copies a rejected record to the dead-letter topic, value untouched, reason in headers.

    Same guarantee as :class:`ResultsWriter`: returns once acknowledged.
    """

    async def dead_letter(self, record: SourceRecord, reason: str, detail: str) -> None: ...


@dataclass(frozen=True, slots=True)
class CommitPoint:
    """Where a partition may commit: ``offset`` (L), and the metadata that makes resuming exact.

    ``processed_until`` (P): every effect triggered below it is recorded. ``journal_from`` (J): the
    results-topic offset from which this partition's still-relevant outcomes start.
    ``finished_from`` (F): the first offset of the earliest-started conversation the finished
    memory holds; a restart scans the source from F to L to rebuild that memory.
    """

    offset: int
    processed_until: int
    journal_from: int
    finished_from: int | None = None

    @property
    def metadata(self) -> str:
        data: dict[str, int] = {"v": METADATA_VERSION, "p": self.processed_until, "j": self.journal_from}
        if self.finished_from is not None and self.finished_from < self.offset:
            data["f"] = self.finished_from
        return json.dumps(data, separators=(",", ":"))


@dataclass(frozen=True, slots=True)
class CommitMetadata:
    processed_until: int
    journal_from: int
    finished_from: int | None


def _offset(value: object) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_OFFSET:
        return value
    return None


def parse_metadata(metadata: str | None) -> CommitMetadata | None:
    """Our commit metadata, or None if absent, foreign or damaged (it is read back from Kafka)."""
    if not metadata or len(metadata) > MAX_METADATA_CHARS:
        return None
    try:
        data = json.loads(metadata)
    except (ValueError, RecursionError):
        return None
    if not isinstance(data, dict) or data.get("v") != METADATA_VERSION:
        return None
    p, j = _offset(data.get("p")), _offset(data.get("j"))
    if p is None or j is None:
        return None
    f = _offset(data.get("f")) if "f" in data else None
    return CommitMetadata(p, j, f)


@dataclass(frozen=True, slots=True)
class Transition:
    """A time-triggered state change recorded in the journal, re-applied at ``position``."""

    position: int
    kind: HookKind
    conversation_id: str
    turn: int


@dataclass(slots=True)
class Recovery:
    """What a partition needs to resume exactly where the previous owner left off."""

    start_offset: int
    replay_until: int
    journal_from: int
    journal_end: int
    keys: set[tuple[str, int, HookKind]] = field(default_factory=set)
    transitions: list[Transition] = field(default_factory=list)
    # The highest source position any journaled outcome was triggered at: past it, nothing
    # recorded before the restart can trigger again and ``keys`` can be dropped.
    last_position: int = -1
    # Source positions of feedback applied at or after ``replay_until``: not applied again.
    feedback_positions: set[int] = field(default_factory=set)
    # Conversations that started in [finished_from, start_offset): all finished before the commit.
    finished: list[tuple[str, int]] = field(default_factory=list)
    # Feedback event ids on those conversations, found by the same scan (taken before the commit).
    feedback_ids: list[str] = field(default_factory=list)
    # Conversations whose end the journal records at or after ``start_offset``, and that position:
    # their earlier events re-read from the start offset are a previous owner's finished work
    # (skipped and counted, not dead-lettered as ``seq_gap`` when their beginning lies below it).
    ended_at: dict[str, int] = field(default_factory=dict)
    # What loading the plan cost and rested on (metrics and logs only): results records read, and
    # whether the committed offset carried the sidecar's metadata ("none": nothing committed).
    journal_records_read: int = 0
    commit_metadata: Literal["present", "missing", "none"] = "none"

    def add(self, entry: ResultRecord) -> None:
        """Fold one validated journal entry of this partition into the plan."""
        kind, cid, turn, pos = entry.kind, entry.conversation_id, entry.turn, entry.position
        self.last_position = max(self.last_position, pos)
        if kind == "feedback":
            if pos >= self.replay_until:
                self.feedback_positions.add(pos)
            return
        if pos >= self.replay_until:
            self.keys.add(trigger_key(cid, turn, kind))
        if kind == "conversation_ended" and pos >= self.start_offset:
            self.ended_at[cid] = pos
        if entry.trigger == "timer" and kind != "user_message":
            self.transitions.append(Transition(pos, kind, cid, turn))

    def seal(self) -> Recovery:
        """Call once every entry is added: transitions in position order."""
        self.transitions.sort(key=lambda t: t.position)
        return self

    @classmethod
    def from_journal(
        cls,
        *,
        start_offset: int,
        replay_until: int,
        journal_from: int,
        journal_end: int,
        records: Iterable[Mapping[str, Any]],
    ) -> Recovery:
        """Fold this partition's journal records (already filtered to it) into a recovery plan;
        records that do not validate are ignored (they cannot suppress anything)."""
        plan = cls(start_offset, replay_until, journal_from, journal_end)
        for r in records:
            entry = entry_from_mapping(r)
            if entry is not None:
                plan.add(entry)
        return plan.seal()
