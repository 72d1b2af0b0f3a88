"""In-memory stand-ins for Kafka, for fast unit tests of the processor (not for behaviour claims
about Kafka itself: those run against the mock cluster in tests/integration)."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

import msgspec

from sidecar.source.journal import CommitPoint, Recovery, SourceRecord
from sidecar.source.result_record import ResultRecord


@dataclass(frozen=True)
class Rec:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp: int = 0


def event(
    cid: str,
    seq: int,
    role: str | None,
    content: str = "x",
    *,
    eid: str | None = None,
    end: bool = False,
    agent: str | None = "a",
) -> dict[str, Any]:
    ev: dict[str, Any] = {
        "conversation_id": cid,
        "event_id": eid or f"{cid}:{seq}",
        "seq": seq,
        "ts": 1.0,
        "type": "conversation_end" if end else "message",
        "agent": agent,
    }
    if not end:
        ev["message"] = {"role": role, "content": content}
    return ev


def record(offset: int, ev: dict[str, Any] | bytes, *, key: bytes | None = None) -> Rec:
    if isinstance(ev, bytes):
        return Rec("t", 0, offset, key, ev)
    return Rec("t", 0, offset, ev["conversation_id"].encode(), json.dumps(ev).encode())


@dataclass
class FakeJournal:
    """Results topic + dead-letter topic of one partition.

    With ``ack_delay`` a submitted record lands (is appended and acknowledged) only that many
    seconds later, like a write in flight in a producer: a record that lands after a new owner read
    the journal is what a missing flush on revoke would turn into a duplicate.
    """

    results: list[dict[str, Any]] = field(default_factory=list)
    dead: list[tuple[int, str]] = field(default_factory=list)
    ack_delay: float = 0.0
    _in_flight: set[asyncio.Future[int]] = field(default_factory=set)

    async def submit(self, source_partition: int, conversation_id: str, rec: ResultRecord) -> asyncio.Future[int]:
        # What a reader of the topic gets back: the record's fields (an unset signature absent).
        record = msgspec.to_builtins(rec)
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[int] = loop.create_future()
        landed: asyncio.Future[int] = loop.create_future()
        if self.ack_delay <= 0:
            self.results.append(record)
            fut.set_result(len(self.results) - 1)
            return fut

        def land() -> None:
            self.results.append(record)
            landed.set_result(len(self.results) - 1)
            self._in_flight.discard(landed)
            if not fut.done():
                fut.set_result(len(self.results) - 1)

        self._in_flight.add(landed)
        loop.call_later(self.ack_delay, land)
        return fut

    async def flush(self, source_partition: int, timeout_seconds: float) -> bool:
        if self._in_flight:
            await asyncio.wait(set(self._in_flight), timeout=timeout_seconds)
        return not self._in_flight

    async def dead_letter(self, record: SourceRecord, reason: str, detail: str) -> None:
        self.dead.append((record.offset, reason))

    def recovery(self, commit: CommitPoint | None) -> Recovery:
        if commit is None:
            return Recovery.from_journal(
                start_offset=0, replay_until=0, journal_from=0, journal_end=len(self.results), records=self.results
            )
        return Recovery.from_journal(
            start_offset=commit.offset,
            replay_until=commit.processed_until,
            journal_from=commit.journal_from,
            journal_end=len(self.results),
            records=self.results[commit.journal_from :],
        )
