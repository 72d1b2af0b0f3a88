"""Rebuild a partition's recovery plan from Kafka alone: committed offset, metadata, journal."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import structlog
from aiokafka import AIOKafkaConsumer, TopicPartition

from sidecar.source.config import KafkaConfig
from sidecar.source.journal import Recovery, parse_metadata
from sidecar.source.writers import client_kwargs

log = structlog.get_logger(__name__)

READ_TIMEOUT_MS = 1000


class JournalReader:
    """A group-less consumer that reads slices of the results topic, one recovery at a time."""

    def __init__(self, cfg: KafkaConfig) -> None:
        self._cfg = cfg
        self._consumer: AIOKafkaConsumer | None = None
        self._lock = asyncio.Lock()

    async def start(self) -> None:
        self._consumer = AIOKafkaConsumer(
            **client_kwargs(self._cfg), group_id=None, enable_auto_commit=False,
            auto_offset_reset="earliest", isolation_level="read_committed",
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

    async def read(self, partition: int, start: int, source_partition: int) -> tuple[list[dict[str, Any]], int]:
        """This source partition's journal records from ``start`` to the current end, and the end."""
        assert self._consumer is not None, "start() first"
        tp = TopicPartition(self._cfg.results_topic, partition)
        async with self._lock:
            c = self._consumer
            c.assign([tp])
            first = int((await c.beginning_offsets([tp]))[tp])
            end = int((await c.end_offsets([tp]))[tp])
            if start < first:
                log.warning("recovery.journal_truncated", partition=source_partition, wanted=start, first=first)
                start = first
            out: list[dict[str, Any]] = []
            if start >= end:
                return out, end
            c.seek(tp, start)
            position = start
            while position < end:
                batch = await c.getmany(tp, timeout_ms=READ_TIMEOUT_MS, max_records=5000)
                for rec in batch.get(tp, []):
                    position = rec.offset + 1
                    if rec.offset >= end:
                        break
                    r = _parse(rec.value)
                    if (
                        r is not None
                        and r.get("group") == self._cfg.group_id
                        and r.get("topic") == self._cfg.topic
                        and r.get("partition") == source_partition
                    ):
                        out.append(r)
                if not batch:
                    position = await c.position(tp)
            return out, end


def _parse(value: bytes | None) -> dict[str, Any] | None:
    try:
        r = json.loads(value or b"")
    except ValueError:
        return None
    return r if isinstance(r, dict) else None


async def load_recovery(
    consumer: AIOKafkaConsumer,
    reader: JournalReader,
    cfg: KafkaConfig,
    tp: TopicPartition,
    journal_partitions: int,
) -> Recovery:
    """Where partition ``tp`` restarts, what it must not fire again, and what it must re-apply."""
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
    if meta is not None:
        replay_until, journal_from = meta
    else:
        # No metadata of ours: nothing is known to be done, so everything from ``start`` fires
        # unless the journal (read from its beginning) says it already did.
        replay_until, journal_from = start, await reader.beginning(jpart)
    records, journal_end = await reader.read(jpart, journal_from, tp.partition)
    log.info("recovery.loaded", partition=tp.partition, start=start, replay_until=replay_until,
             journal_from=journal_from, journal_records=len(records))
    return Recovery.from_journal(
        start_offset=start, replay_until=max(replay_until, start), journal_from=journal_from,
        journal_end=journal_end, records=records,
    )
