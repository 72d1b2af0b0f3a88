"""Rebuild a partition's recovery plan from Kafka alone: committed offset, metadata, journal, and
the source itself for the memory of finished conversations."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable

import structlog
from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition

from sidecar.errors import DecodeError
from sidecar.events import decode_event
from sidecar.kafka_clients import client_kwargs
from sidecar.source.config import KafkaConfig
from sidecar.source.journal import Recovery, parse_metadata
from sidecar.source.journal_entry import JournalSigner, read_entry

log = structlog.get_logger(__name__)

READ_TIMEOUT_MS = 1000
READ_BATCH_RECORDS = 5000
# Past the reported end, one fetch this long that returns nothing ends a journal read.
TAIL_TIMEOUT_MS = 200
# ... and at most this many fetches past it: what another owner of a shared journal partition
# writes meanwhile is not this read's business (what the previous owner wrote is all before it).
TAIL_MAX_FETCHES = 4
# Recovery runs on the event loop beside live partitions: yield after this many records so that
# one long scan never holds the loop for more than a few milliseconds.
YIELD_EVERY_RECORDS = 500

SkipCounter = Callable[[str], None]


class JournalReader:
    """A group-less consumer that reads slices of the results and source topics, one at a time."""

    def __init__(self, cfg: KafkaConfig) -> None:
        self._cfg = cfg
        self._consumer: AIOKafkaConsumer | None = None
        self._lock = asyncio.Lock()

    async def start(self) -> None:
        self._consumer = AIOKafkaConsumer(
            **client_kwargs(self._cfg),
            group_id=None,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            isolation_level="read_committed",
            fetch_max_bytes=self._cfg.fetch_max_bytes,
            fetch_max_wait_ms=TAIL_TIMEOUT_MS,
        )
        await self._consumer.start()

    async def stop(self) -> None:
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            await consumer.stop()

    async def beginning(self, partition: int) -> int:
        assert self._consumer is not None, "start() first"
        tp = TopicPartition(self._cfg.results_topic, partition)
        return int((await self._consumer.beginning_offsets([tp]))[tp])

    async def records(
        self, topic: str, partition: int, start: int, end: int | None = None, *, to_tail: bool = False
    ) -> AsyncIterator[ConsumerRecord[bytes, bytes]]:
        """Records of one partition from ``start`` (or its first retained offset) up to ``end``
        (default: its end when the read starts). Holds the reader for the whole slice.

        ``to_tail``: go on past ``end`` for as long as the broker still returns records. A reported
        end offset can fall short of what was acknowledged (Tansu answers ListOffsets with the
        last batch's first offset + 1), and a journal read that stops there would miss the tail
        of the last batch and repeat its effects.
        """
        assert self._consumer is not None, "start() first"
        tp = TopicPartition(topic, partition)
        async with self._lock:
            c = self._consumer
            c.assign([tp])
            first = int((await c.beginning_offsets([tp]))[tp])
            last = int((await c.end_offsets([tp]))[tp])
            end = last if end is None else min(end, last)
            if start < first:
                log.warning("recovery.truncated", topic=topic, partition=partition, wanted=start, first=first)
                start = first
            if start >= end and not to_tail:
                return
            c.seek(tp, max(start, first))
            position = start
            seen = 0
            tail_fetches = 0
            while True:
                past_end = position >= end
                if past_end and (not to_tail or tail_fetches >= TAIL_MAX_FETCHES):
                    return
                tail_fetches += past_end
                timeout = TAIL_TIMEOUT_MS if past_end else READ_TIMEOUT_MS
                batch = await c.getmany(tp, timeout_ms=timeout, max_records=READ_BATCH_RECORDS)
                records = batch.get(tp, [])
                if not records and past_end:
                    return
                for rec in records:
                    position = rec.offset + 1
                    if rec.offset >= end and not to_tail:
                        return
                    yield rec
                    seen += 1
                    if seen % YIELD_EVERY_RECORDS == 0:
                        await asyncio.sleep(0)
                if not records:
                    position = await c.position(tp)

    async def journal_end(self, partition: int) -> int:
        assert self._consumer is not None, "start() first"
        tp = TopicPartition(self._cfg.results_topic, partition)
        return int((await self._consumer.end_offsets([tp]))[tp])


async def load_recovery(  # noqa: PLR0917 - the worker passes its collaborators in one call
    consumer: AIOKafkaConsumer,
    reader: JournalReader,
    cfg: KafkaConfig,
    tp: TopicPartition,
    journal_partitions: int,
    signer: JournalSigner,
    on_skip: SkipCounter,
) -> Recovery:
    """Where partition ``tp`` restarts, what it must not fire again, and what it must re-apply.

    Journal records are untrusted input: each is validated (and its signature checked when keys
    are configured); one that fails is counted through ``on_skip(reason)`` and ignored.
    """
    began = time.monotonic()
    committed = await consumer._coordinator.fetch_committed_offsets([tp])
    om = committed.get(tp)
    jpart = tp.partition % journal_partitions
    meta = parse_metadata(om.metadata) if om is not None and om.offset >= 0 else None
    if om is not None and om.offset >= 0:
        start = int(om.offset)
    elif cfg.auto_offset_reset == "earliest":
        start = int((await consumer.beginning_offsets([tp]))[tp])
    else:
        start = int((await consumer.end_offsets([tp]))[tp])
    finished_from: int | None = None
    if meta is not None:
        replay_until, journal_from, finished_from = meta.processed_until, meta.journal_from, meta.finished_from
    else:
        # No metadata of ours: nothing is known to be done, so everything from ``start`` fires
        # unless the journal (read from its beginning) says it already did.
        replay_until, journal_from = start, await reader.beginning(jpart)
    journal_end = await reader.journal_end(jpart)
    plan = Recovery(start, max(replay_until, start), journal_from, journal_end)
    if om is not None and om.offset >= 0:
        plan.commit_metadata = "present" if meta is not None else "missing"
    read = 0
    async for rec in reader.records(cfg.results_topic, jpart, journal_from, journal_end, to_tail=True):
        plan.journal_records_read += 1
        plan.journal_end = max(plan.journal_end, rec.offset + 1)
        entry, reason = read_entry(rec.value, signer)
        if entry is None:
            on_skip(reason or "invalid")
            continue
        if entry.group == cfg.group_id and entry.topic == cfg.topic and entry.partition == tp.partition:
            plan.add(entry)
            read += 1
    if finished_from is not None and finished_from < start:
        plan.finished, plan.feedback_ids = await _finished_starts(reader, cfg, tp.partition, finished_from, start)
    log.info(
        "recovery.loaded",
        partition=tp.partition,
        start=start,
        replay_until=plan.replay_until,
        journal_from=journal_from,
        journal_records=read,
        finished_scanned=len(plan.finished),
    )
    if plan.commit_metadata == "missing":
        # Correct (the whole journal partition stands in for the metadata), but its cost grows with
        # the results topic's retention: say what it was, every time.
        log.warning(
            "recovery.without_commit_metadata",
            partition=tp.partition,
            committed_offset=start,
            journal_records_read=plan.journal_records_read,
            seconds=round(time.monotonic() - began, 3),
        )
    return plan.seal()


async def _finished_starts(
    reader: JournalReader, cfg: KafkaConfig, partition: int, start: int, end: int
) -> tuple[list[tuple[str, int]], list[str]]:
    """Conversations that started in [start, end) of the source: every one has finished, since
    ``end`` is a commit offset (the first offset of the oldest conversation still open); and the
    ids of the feedback events on them in that range (see :mod:`sidecar.state.feedback`)."""
    out: list[tuple[str, int]] = []
    started: set[str] = set()
    feedback: list[str] = []
    async for rec in reader.records(cfg.topic, partition, start, end):
        try:
            ev = decode_event(rec.value, rec.key, max_bytes=cfg.max_record_bytes)
        except DecodeError:
            continue
        if ev.seq == 0 and ev.type == "message":
            out.append((ev.conversation_id, rec.offset))
            started.add(ev.conversation_id)
        elif ev.type == "feedback" and ev.conversation_id in started:
            feedback.append(ev.event_id)
    return out, feedback
