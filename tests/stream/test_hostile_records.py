"""Hostile records through the partition processor: each is dead-lettered with its own reason and
the conversations around it go on (decoder and state-machine tests cover each case in detail)."""

from __future__ import annotations

import json

from prometheus_client import CollectorRegistry

from sidecar.source.processor import PartitionProcessor
from sidecar.state.config import StateConfig
from sidecar.state.hooks import RecordingHooks
from sidecar.telemetry.stream_metrics import StreamMetrics
from tests.stream.fakes import FakeJournal, event, record

CAP = 6


def make(journal: FakeJournal, hooks: RecordingHooks) -> PartitionProcessor:
    return PartitionProcessor(
        partition=0,
        state_config=StateConfig(turn_debounce_seconds=5, idle_ttl_seconds=60, max_messages_per_conversation=CAP),
        hooks=hooks,
        results=journal,
        dead_letters=journal,
        metrics=StreamMetrics(CollectorRegistry()),
        recovery=journal.recovery(None),
        max_record_bytes=100_000,
        max_pending=8,
        clock=lambda: 0.0,
    )


def deep_arguments(cid: str, seq: int, depth: int) -> bytes:
    ev = event(cid, seq, "assistant")
    ev["message"]["tool_calls"] = [{"name": "f", "arguments": {"placeholder": 0}}]
    text = json.dumps(ev)
    return text.replace('{"placeholder": 0}', '{"a": ' * depth + "1" + "}" * depth).encode()


async def test_hostile_records_are_dead_lettered_each_for_its_reason_and_the_stream_goes_on() -> None:
    j = FakeJournal()
    hooks = RecordingHooks()
    p = make(j, hooks)
    records = [
        record(0, event("ok", 0, "user")),
        record(1, deep_arguments("deep", 0, 900), key=b"deep"),  # once raised RecursionError
        record(2, {**event("ts", 0, "user"), "ts": "yesterday"}),
        record(3, {**event("ts", 0, "user"), "ts": 1.7e12}),  # milliseconds as seconds
        record(4, {**event("ts", 0, "user"), "agent": "booking\n"}),
    ]
    # A conversation past its cap: the rest of it is too long, never a gap, and its end ends it.
    records += [record(5 + i, event("long", i, "user" if i % 2 == 0 else "assistant")) for i in range(CAP + 3)]
    records.append(record(5 + CAP + 3, event("long", CAP + 3, None, end=True)))
    records.append(record(5 + CAP + 4, event("ok", 1, "assistant")))
    for r in records:
        await p.process(r, 0.0)
    assert await p.drain(5)
    assert j.dead == [
        (1, "schema"),
        (2, "invalid_timestamp"),
        (3, "invalid_timestamp"),
        (4, "schema"),
        (5 + CAP, "conversation_too_long"),
        (5 + CAP + 1, "conversation_too_long"),
        (5 + CAP + 2, "conversation_too_long"),
    ]
    assert "long" not in p.state.conversations  # its end was applied
    assert len(p.state.conversations["ok"].messages) == 2
    assert p.next_offset == len(records)
