"""The results topic doubles as the exactly-once journal.

Each hook outcome is one record in the results topic. The committed offset of a source partition
is its *low-watermark* L (first offset of the oldest conversation still open or still owed an
effect) and the commit metadata carries ``p`` (every effect triggered below this offset is recorded)
and ``j`` (the results-topic offset from which this partition's still-relevant outcomes start).

After a restart the partition re-reads the source from L with hooks suppressed below ``p`` and
re-reads the results topic from ``j``: outcomes recorded after the last commit are not produced
again, and time-triggered transitions (idle debounce, idle TTL, eviction) are re-applied at the
position where they first happened, so the rebuilt state is the one the crashed process had.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from sidecar.state.hooks import HookKind
from sidecar.state.store import trigger_key

METADATA_VERSION = 1
RESULT_VERSION = 1


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
        self, source_partition: int, conversation_id: str, record: dict[str, Any]
    ) -> asyncio.Future[int]: ...


class DeadLetterWriter(Protocol):
    """Copies a rejected record to the dead-letter topic, value untouched, reason in headers.

    Same guarantee as :class:`ResultsWriter`: returns once acknowledged.
    """

    async def dead_letter(self, record: SourceRecord, reason: str, detail: str) -> None: ...


@dataclass(frozen=True, slots=True)
class CommitPoint:
    offset: int
    processed_until: int
    journal_from: int

    @property
    def metadata(self) -> str:
        return json.dumps({"v": METADATA_VERSION, "p": self.processed_until, "j": self.journal_from},
                          separators=(",", ":"))


def parse_metadata(metadata: str | None) -> tuple[int, int] | None:
    """``(processed_until, journal_from)`` from commit metadata, or None if absent or foreign."""
    if not metadata:
        return None
    try:
        data = json.loads(metadata)
    except ValueError:
        return None
    if not isinstance(data, dict) or data.get("v") != METADATA_VERSION:
        return None
    p, j = data.get("p"), data.get("j")
    if not (isinstance(p, int) and isinstance(j, int)) or isinstance(p, bool) or isinstance(j, bool):
        return None
    if p < 0 or j < 0:
        return None
    return p, j


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
        """Fold this partition's journal records (already filtered to it) into a recovery plan."""
        keys: set[tuple[str, int, HookKind]] = set()
        transitions: list[Transition] = []
        last = -1
        for r in records:
            try:
                kind, cid, turn, pos = r["kind"], r["conversation_id"], int(r["turn"]), int(r["position"])
            except (KeyError, TypeError, ValueError):
                continue  # a foreign or damaged record cannot suppress anything
            if kind not in ("user_message", "turn_closed", "conversation_ended") or not isinstance(cid, str):
                continue
            last = max(last, pos)
            if pos >= replay_until:
                keys.add(trigger_key(cid, turn, kind))
            if r.get("trigger") == "timer" and kind != "user_message":
                transitions.append(Transition(pos, kind, cid, turn))
        transitions.sort(key=lambda t: t.position)
        return cls(start_offset, replay_until, journal_from, journal_end, keys, transitions, last)
