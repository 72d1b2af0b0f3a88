"""A superseded member writes nothing: once the fence is up (a loop stall longer than the member can
go without a heartbeat, a lost generation, a refused commit) its processors fire no hook, offer no
sink, journal no outcome, dead-letter nothing and have no commit point, and what they had pending
is abandoned; the next owner redoes it from the journal, once."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer, TopicPartition
from aiokafka.errors import KafkaError
from prometheus_client import CollectorRegistry

from sidecar.contract import Effect, Outcome, TurnContext
from sidecar.source.config import KafkaConfig
from sidecar.source.fence import MemberFence
from sidecar.source.journal import Recovery
from sidecar.source.journal_entry import JournalSigner
from sidecar.source.processor import PartitionProcessor
from sidecar.source.result_record import ResultRecord
from sidecar.source.results import KafkaResultsWriter
from sidecar.stage.pipeline import PostScoreStage
from sidecar.state.config import StateConfig
from sidecar.state.hooks import RecordingHooks
from sidecar.telemetry.stream_metrics import StreamMetrics
from tests.stream.fakes import FakeJournal, event, record
from tests.stream.test_processor import Clock, keys_of
from tests.stream.test_results_wire import _Builder, _KeepingProducer

STALL_LIMIT = 5.0


class Term:
    """The coordinator's (generation, member id), as a test moves it."""

    def __init__(self) -> None:
        self.value = (3, "member-a")

    def __call__(self) -> tuple[int, str]:
        return self.value


class CountingSink:
    """An outcome sink that counts what it is offered, by key (an alert sink's view)."""

    name = "counting"

    def __init__(self) -> None:
        self.offered: Counter[tuple[str, int, str]] = Counter()

    def offer(self, effect: Effect) -> None:
        ctx = effect.ctx
        self.offered[(ctx.conversation_id, 0 if ctx.kind == "conversation_ended" else ctx.turn, ctx.kind)] += 1


class GatedHooks(RecordingHooks):
    """``user_message`` answers only once the gate opens (a scorer still working when the stall hits)."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()

    async def _later(self, ctx: TurnContext) -> Outcome:
        await self.gate.wait()
        return self._record(ctx)

    def on_user_message(self, ctx: TurnContext) -> Any:
        return self._later(ctx)


class FlushCountingJournal(FakeJournal):
    def __init__(self) -> None:
        super().__init__()
        self.flushes = 0

    async def flush(self, source_partition: int, timeout_seconds: float) -> bool:
        self.flushes += 1
        return await super().flush(source_partition, timeout_seconds)


def fence_for(clock: Clock, term: Term | None = None) -> MemberFence:
    fence = MemberFence(STALL_LIMIT, term=term or Term(), clock=clock)
    fence.watching(True)
    fence.arm()
    return fence


def member(
    journal: FakeJournal,
    recovery: Recovery,
    *,
    clock: Clock,
    fence: MemberFence | None = None,
    hooks: Any = None,
    sink: CountingSink | None = None,
) -> PartitionProcessor:
    return PartitionProcessor(
        partition=0,
        state_config=StateConfig(turn_debounce_seconds=5, idle_ttl_seconds=60),
        hooks=hooks or RecordingHooks(),
        results=journal,
        dead_letters=journal,
        metrics=StreamMetrics(CollectorRegistry()),
        recovery=recovery,
        max_record_bytes=10_000,
        max_pending=8,
        clock=clock,
        stage=PostScoreStage([sink]) if sink is not None else None,
        fence=fence,
    )


CONVERSATION = [
    event("c", 0, "user"),
    event("c", 1, "assistant"),
    event("c", 2, "user"),
    event("c", 3, "assistant"),
    event("c", 4, None, end=True),
]


async def test_a_woken_member_writes_nothing_and_the_next_owner_writes_everything_once() -> None:
    """The issue's stall: the old owner stops with a hook pending; the group hands the partition to
    the next owner, which recovers from the last commit and finishes the conversation; the old
    owner wakes, its hook answers and its idle timer makes every turn look due. Nothing of it may
    reach the journal or a sink, or an outcome is written twice and a turn closed two ways."""
    journal = FakeJournal()
    clock = Clock()
    hooks = GatedHooks()
    old_sink = CountingSink()
    fence = fence_for(clock)
    old = member(journal, journal.recovery(None), clock=clock, fence=fence, hooks=hooks, sink=old_sink)
    for i, ev in enumerate(CONVERSATION[:2]):
        await old.process(record(i, ev), 0.0)
    commit = old.commit_point()
    assert commit is not None and commit.processed_until == 0  # the pending hook pins it
    assert old.pending_effects == 1

    clock.now += 20  # SIGSTOP: no beat for 20 s, past what the session survives

    new_sink = CountingSink()
    new = member(journal, journal.recovery(commit), clock=Clock(), sink=new_sink)
    for i, ev in enumerate(CONVERSATION):
        await new.process(record(i, ev), 0.0)
    assert await new.drain(5)

    # SIGCONT: the old owner's scorer answers, its sweep runs, records keep arriving.
    hooks.gate.set()
    await asyncio.sleep(0.01)
    await old.tick()
    await old.process(record(2, CONVERSATION[2]), 0.0)
    assert old.commit_point() is None
    assert await old.release(grace_seconds=1, flush_timeout_seconds=1) is None

    assert fence.reason == "loop_stalled"
    expected = Counter(
        {
            ("c", 1, "user_message"): 1,
            ("c", 1, "turn_closed"): 1,
            ("c", 2, "user_message"): 1,
            ("c", 2, "turn_closed"): 1,
            ("c", 0, "conversation_ended"): 1,
        }
    )
    assert keys_of(journal) == expected
    closes = {r["turn"]: r["close_reason"] for r in journal.results if r["kind"] == "turn_closed"}
    assert "idle_debounce" not in closes.values()  # every turn closed by the next owner's records
    assert sum(old_sink.offered.values()) == 0  # the woken owner fired no sink
    assert new_sink.offered == expected


async def test_a_stall_shorter_than_the_limit_changes_nothing() -> None:
    journal = FakeJournal()
    clock = Clock()
    fence = fence_for(clock)
    p = member(journal, journal.recovery(None), clock=clock, fence=fence)
    await p.process(record(0, CONVERSATION[0]), 0.0)
    clock.now += STALL_LIMIT - 0.5
    fence.beat()
    await p.process(record(1, CONVERSATION[1]), 0.0)
    assert fence.reason is None and p.live
    assert p.commit_point() is not None


async def test_a_lost_generation_stops_journal_dead_letters_and_commits() -> None:
    """aiokafka resets the generation when a heartbeat, join or commit is answered IllegalGeneration
    or UnknownMemberId: from then on nothing of the assignment is written."""
    journal = FakeJournal()
    clock = Clock()
    term = Term()
    fence = fence_for(clock, term)
    p = member(journal, journal.recovery(None), clock=clock, fence=fence)
    await p.process(record(0, CONVERSATION[0]), 0.0)
    assert len(journal.results) == 1
    term.value = (-1, "")  # reset_generation()
    await p.process(record(1, event("c", 9, "user")), 0.0)  # a seq gap: would be dead-lettered
    await p.process(record(2, CONVERSATION[1]), 0.0)
    await p.process(record(3, CONVERSATION[2]), 0.0)  # would close turn 1 and open turn 2
    clock.now += 100
    fence.beat()
    await p.tick()
    assert fence.reason == "generation_lost"
    assert len(journal.results) == 1 and journal.dead == []
    assert p.commit_point() is None


async def test_release_of_a_fenced_partition_neither_waits_nor_flushes() -> None:
    """Waiting for pending effects or flushing their writes would only land them after the next
    owner read the journal."""
    journal = FlushCountingJournal()
    clock = Clock()
    hooks = GatedHooks()
    term = Term()
    fence = fence_for(clock, term)
    p = member(journal, journal.recovery(None), clock=clock, fence=fence, hooks=hooks)
    await p.process(record(0, CONVERSATION[0]), 0.0)
    fence.fence("commit_refused")
    assert await p.release(grace_seconds=30, flush_timeout_seconds=30) is None
    assert journal.flushes == 0
    hooks.gate.set()
    await asyncio.sleep(0.01)
    assert journal.results == []


async def test_fenced_during_the_grace_period_abandons_instead_of_flushing() -> None:
    journal = FlushCountingJournal()
    clock = Clock()
    hooks = GatedHooks()
    term = Term()
    fence = fence_for(clock, term)
    p = member(journal, journal.recovery(None), clock=clock, fence=fence, hooks=hooks)
    await p.process(record(0, CONVERSATION[0]), 0.0)

    async def superseded_then_answer() -> None:
        await asyncio.sleep(0.02)
        term.value = (4, "member-b")  # a new generation this member is not part of
        hooks.gate.set()

    later = asyncio.create_task(superseded_then_answer())
    began = asyncio.get_running_loop().time()
    assert await p.release(grace_seconds=30, flush_timeout_seconds=30) is None
    assert asyncio.get_running_loop().time() - began < 20  # the grace period ends with the fence
    await later
    assert journal.flushes == 0 and journal.results == []


async def test_the_fence_keeps_its_first_reason_and_old_epochs_stay_fenced() -> None:
    clock = Clock()
    term = Term()
    calls: list[str] = []
    fence = MemberFence(STALL_LIMIT, term=term, clock=clock, on_fenced=calls.append)
    clock.now = 100  # not armed (no assignment) and not watching: nothing to fence
    assert not fence.fenced
    fence.watching(True)
    first = fence.arm()
    clock.now += STALL_LIMIT + 1
    assert fence.fenced and fence.reason == "loop_stalled"
    fence.fence("commit_refused")
    assert fence.reason == "loop_stalled" and calls == ["loop_stalled"]
    term.value = (4, "member-a")
    second = fence.arm()  # the rejoin's assignment
    assert fence.allows(second) and not fence.allows(first)
    fence.watching(False)
    clock.now += 1000  # the watchdog stopped (shutdown): a missing beat is no stall
    assert fence.allows(second)


async def test_the_results_writer_drops_fenced_records_it_has_not_shipped() -> None:
    """A record submitted just before the stall waits in an open batch until the next loop turn:
    after the wake it must not reach the producer. ``discard`` drops a partition's open records."""
    producer = _KeepingProducer()
    cfg = KafkaConfig(bootstrap_servers="unused:9092", topic="t", group_id="g")
    writer = KafkaResultsWriter(producer, cfg, StreamMetrics(CollectorRegistry()), JournalSigner([]))
    clock = Clock()
    fence = fence_for(clock)
    writer.fence = fence

    def rec(cid: str) -> ResultRecord:
        return ResultRecord(
            v=1, partition=0, position=0, trigger="record", kind="user_message", conversation_id=cid, turn=1
        )

    stalled = await writer.submit(0, "a", rec("a"))
    clock.now += STALL_LIMIT + 1
    await asyncio.sleep(0.01)
    assert producer.sent == [] and stalled.cancelled()

    fence.arm()  # the next assignment
    kept = await writer.submit(1, "b", rec("b"))
    dropped = await writer.submit(0, "c", rec("c"))
    writer.discard(0)
    async with asyncio.timeout(5):
        assert await kept >= 0
    assert dropped.cancelled()
    assert [k for _, k, _ in producer.sent] == [b"b"]


class _SlowAckProducer(_KeepingProducer):
    """Acknowledges each batch only when the test says so: a slow broker, one request at a time."""

    def __init__(self) -> None:
        super().__init__()
        self.handed = 0
        self.acks: list[asyncio.Future[None]] = []

    async def send_batch(self, batch: _Builder, topic: str, *, partition: int) -> Any:
        self.handed += 1
        gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.acks.append(gate)
        done = await super().send_batch(batch, topic, partition=partition)

        async def later() -> Any:
            await gate
            return await done

        return asyncio.ensure_future(later())


async def test_records_waiting_behind_a_batch_in_flight_are_dropped_after_a_stall() -> None:
    """The stall test's repeats: while one batch waits for a slow broker, the next outcomes queue up.
    Handed to the producer, they would go out after the wake, after the next owner read the
    journal; kept in the writer until the batch before them is acknowledged, the fence drops them."""
    producer = _SlowAckProducer()
    cfg = KafkaConfig(bootstrap_servers="unused:9092", topic="t", group_id="g")
    writer = KafkaResultsWriter(producer, cfg, StreamMetrics(CollectorRegistry()), JournalSigner([]))
    clock = Clock()
    writer.fence = fence_for(clock)

    def rec(cid: str) -> ResultRecord:
        return ResultRecord(
            v=1, partition=0, position=0, trigger="record", kind="user_message", conversation_id=cid, turn=1
        )

    first = await writer.submit(0, "a", rec("a"))
    await asyncio.sleep(0.01)  # the first batch is with the producer, unacknowledged
    queued = [await writer.submit(0, c, rec(c)) for c in "bcd"]
    await asyncio.sleep(0.01)
    assert producer.handed == 1  # the rest waits in the writer
    clock.now += STALL_LIMIT + 1  # SIGSTOP ... SIGCONT
    producer.acks[0].set_result(None)
    async with asyncio.timeout(5):
        assert await first >= 0
    await asyncio.sleep(0.01)
    assert producer.handed == 1 and all(f.cancelled() for f in queued)
    assert [k for _, k, _ in producer.sent] == [b"a"]


async def test_batches_still_queued_inside_the_kafka_client_are_failed_when_the_fence_goes_up() -> None:
    """The batch handed to aiokafka just before the stall waits in its accumulator behind another
    request; the fence fails it there (the stall test's remaining repeats), and leaves other
    topics' batches alone."""
    producer = AIOKafkaProducer(bootstrap_servers="unused:9092")  # never started: nothing is sent
    cfg = KafkaConfig(bootstrap_servers="unused:9092", topic="t", group_id="g")
    writer = KafkaResultsWriter(producer, cfg, StreamMetrics(CollectorRegistry()), JournalSigner([]))
    accumulator = producer._message_accumulator
    queued: list[Any] = []
    for topic in (cfg.results_topic, cfg.results_topic, cfg.dead_letter_topic):
        builder = producer.create_batch()
        builder.append(timestamp=None, key=b"k", value=b"v")
        queued.append(await accumulator.add_batch(builder, TopicPartition(topic, len(queued)), timeout=1))
    assert writer.drop_unsent() == 2
    for fut in queued[:2]:
        with pytest.raises(KafkaError):
            await fut
    assert not queued[2].done()
    assert list(accumulator._batches) == [TopicPartition(cfg.dead_letter_topic, 2)]
    await producer.stop()
