"""A partition's new owner re-reads from the committed offset L. Without commit metadata (brokers
that drop it, e.g. Tansu) nothing below the old processed point is replayed silently: the tail of a
conversation that began below L and finished at or after it is re-read with no beginning. The
journal shows that conversation finished, so those events are skipped and counted
(``sidecar_events_skipped_total{reason="conversation_finished_at_handover"}``), never dead-lettered
as ``seq_gap``; an event of it sent again after its end is still dead-lettered."""

from __future__ import annotations

from collections import Counter

from prometheus_client import CollectorRegistry

from sidecar.source.journal import Recovery
from sidecar.source.processor import PartitionProcessor
from sidecar.state.config import StateConfig
from sidecar.state.hooks import RecordingHooks
from sidecar.telemetry.stream_metrics import StreamMetrics
from tests.stream.fakes import FakeJournal, event, record
from tests.stream.test_processor import Clock, keys_of

STREAM = [
    event("a", 0, "user"),  # 0: a begins
    event("b", 0, "user"),  # 1: b begins (open at the commit: L = 1)
    event("a", 1, "assistant"),  # 2
    event("a", 2, None, end=True),  # 3: a ends
    event("b", 1, "assistant"),  # 4
]


def processor(journal: FakeJournal, recovery: Recovery, metrics: StreamMetrics) -> PartitionProcessor:
    return PartitionProcessor(
        partition=0,
        state_config=StateConfig(turn_debounce_seconds=5, idle_ttl_seconds=60),
        hooks=RecordingHooks(),
        results=journal,
        dead_letters=journal,
        metrics=metrics,
        recovery=recovery,
        max_record_bytes=10_000,
        max_pending=8,
        clock=Clock(),
    )


def skipped(registry: CollectorRegistry) -> float | None:
    return registry.get_sample_value("sidecar_events_skipped_total", {"reason": "conversation_finished_at_handover"})


async def test_finished_tails_re_read_without_metadata_are_skipped_and_counted() -> None:
    journal = FakeJournal()
    first = processor(journal, journal.recovery(None), StreamMetrics(CollectorRegistry()))
    for i, ev in enumerate(STREAM):
        await first.process(record(i, ev), 0.0)
    assert await first.drain(5)
    commit = first.commit_point()
    assert commit is not None and commit.offset == 1  # b is open
    written = Counter(keys_of(journal))

    # The brokers dropped the metadata: L alone comes back, the whole journal is read.
    recovery = Recovery.from_journal(
        start_offset=commit.offset,
        replay_until=commit.offset,
        journal_from=0,
        journal_end=len(journal.results),
        records=journal.results,
    )
    registry = CollectorRegistry()
    second = processor(journal, recovery, StreamMetrics(registry))
    for i, ev in enumerate(STREAM[1:], start=1):
        await second.process(record(i, ev), 0.0)
    late = event("a", 1, "assistant", eid="a:resent")
    await second.process(record(5, late), 0.0)  # sent again after a's end: still refused
    assert await second.drain(5)

    assert journal.dead == [(5, "seq_gap")]
    assert skipped(registry) == 2  # a's offsets 2 and 3
    assert Counter(keys_of(journal)) == written  # nothing fired twice


async def test_a_gap_in_a_conversation_the_journal_does_not_show_finished_is_still_dead_lettered() -> None:
    journal = FakeJournal()
    registry = CollectorRegistry()
    p = processor(journal, journal.recovery(None), StreamMetrics(registry))
    await p.process(record(0, event("x", 3, "user")), 0.0)
    assert await p.drain(5)
    assert journal.dead == [(0, "seq_gap")]
    assert skipped(registry) == 0
