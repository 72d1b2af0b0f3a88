"""``CompactedTable`` against real brokers: catching up, following, fencing, tombstones and
hostile records (librdkafka's mock cluster), a topic that does not exist yet (Tansu)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import pytest
from aiokafka import AIOKafkaProducer
from prometheus_client import CollectorRegistry

from sidecar.fleet.publisher import TablePublisher
from sidecar.fleet.table import Change, CompactedTable, InvalidRow, TableMetrics, fenced
from sidecar.source.config import KafkaConfig
from sidecar.tools.demo.mock_cluster import MockKafkaCluster
from tests.support.tansu import TansuBroker


@dataclass(frozen=True)
class Row:
    generation: int
    version: int
    body: str


def decode(value: bytes) -> Row:
    try:
        data = json.loads(value)
        return Row(int(data["generation"]), int(data["version"]), str(data["body"]))
    except (ValueError, KeyError, TypeError) as exc:
        raise InvalidRow(type(exc).__name__) from None


def encode(generation: int, version: int, body: str) -> bytes:
    return json.dumps({"generation": generation, "version": version, "body": body}).encode()


@pytest.fixture(scope="module")
def kafka() -> AsyncIterator[str]:
    with MockKafkaCluster(1) as cluster:
        yield cluster.bootstrap_servers


async def _produce(bootstrap: str, topic: str, records: list[tuple[bytes, bytes | None]]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        # One partition, as the tables' own topics have (sidecar.fleet.topics): the order of the
        # records is the order written (an auto-created topic of several partitions would let a
        # reader see b and c in either order and the row bound keep either).
        for key, value in records:
            await producer.send_and_wait(topic, value=value, key=key, partition=0)
    finally:
        await producer.stop()


def _table(bootstrap: str, topic: str, **kw: object) -> tuple[CompactedTable[Row], CollectorRegistry]:
    registry = CollectorRegistry()
    cfg = KafkaConfig(bootstrap_servers=bootstrap, topic="unused")
    table: CompactedTable[Row] = CompactedTable(
        "t",
        topic,
        cfg,
        decode,
        TableMetrics(registry),
        accept=fenced,
        **kw,  # type: ignore[arg-type]
    )
    return table, registry


async def _until(predicate: Callable[[], bool], seconds: float = 30) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while True:
        if predicate():
            return
        assert loop.time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.05)


async def test_catches_up_on_what_exists_then_follows(kafka: str) -> None:
    topic = "table-follow"
    await _produce(kafka, topic, [(f"k{i}".encode(), encode(1, i, f"b{i}")) for i in range(200)])
    table, registry = _table(kafka, topic)
    seen: list[Change[Row]] = []
    table.subscribe(seen.append)
    await table.start()
    try:
        async with asyncio.timeout(30):
            await table.wait_caught_up()
        # Caught up means everything that existed at start is applied, not just some of it.
        assert len(table) == 200
        assert table.get("k7") == Row(1, 7, "b7")
        assert table.health().ready
        publisher = TablePublisher(topic, KafkaConfig(bootstrap_servers=kafka, topic="unused"))
        try:
            await publisher.publish("k7", encode(1, 8, "newer"), timeout_seconds=10)
        finally:
            await publisher.stop()
        await _until(lambda: table.get("k7") == Row(1, 8, "newer"))
        assert seen[-1] == Change("k7", Row(1, 8, "newer"))
    finally:
        await table.stop()
    assert registry.get_sample_value("sidecar_fleet_table_caught_up", {"table": "t"}) == 1


async def test_an_older_writer_never_replaces_a_newer_one(kafka: str) -> None:
    topic = "table-fence"
    await _produce(
        kafka,
        topic,
        [
            (b"model", encode(5, 1, "leader of generation 5")),
            (b"model", encode(7, 1, "successor, generation 7")),
            (b"model", encode(5, 2, "the old leader woke up")),  # later in the topic, older writer
            (b"model", encode(7, 1, "a repeat of the same version")),
        ],
    )
    table, registry = _table(kafka, topic)
    await table.start()
    try:
        async with asyncio.timeout(30):
            await table.wait_caught_up()
    finally:
        await table.stop()
    assert table.get("model") == Row(7, 1, "successor, generation 7")
    assert registry.get_sample_value("sidecar_fleet_table_records_total", {"table": "t", "outcome": "stale"}) == 2


async def test_hostile_records_are_counted_and_skipped(kafka: str) -> None:
    topic = "table-hostile"
    await _produce(
        kafka,
        topic,
        [
            (b"\xff\xfe", encode(1, 1, "key not UTF-8")),
            (b"ok", b"{not json"),
            (b"ok", json.dumps({"generation": "x"}).encode()),
            (b"ok", b"[" * 100_000),
            (b"big", encode(1, 1, "x" * 5000)),
            (b"ok", encode(1, 1, "fine")),
        ],
    )
    table, registry = _table(kafka, topic, max_record_bytes=4096)
    await table.start()
    try:
        async with asyncio.timeout(30):
            await table.wait_caught_up()
    finally:
        await table.stop()
    assert dict(table.items()) == {"ok": Row(1, 1, "fine")}
    assert registry.get_sample_value("sidecar_fleet_table_records_total", {"table": "t", "outcome": "invalid"}) == 5


async def test_tombstones_delete_and_the_row_bound_holds(kafka: str) -> None:
    topic = "table-bound"
    await _produce(
        kafka,
        topic,
        [(b"a", encode(1, 1, "a")), (b"b", encode(1, 1, "b")), (b"c", encode(1, 1, "c")), (b"a", None)],
    )
    table, registry = _table(kafka, topic, max_rows=2)
    deleted: list[Change[Row]] = []
    table.subscribe(lambda change: deleted.append(change) if change.value is None else None)
    await table.start()
    try:
        async with asyncio.timeout(30):
            await table.wait_caught_up()
    finally:
        await table.stop()
    assert dict(table.items()) == {"b": Row(1, 1, "b")}
    assert deleted == [Change("a", None)]
    assert registry.get_sample_value("sidecar_fleet_table_records_total", {"table": "t", "outcome": "full"}) == 1


async def test_a_callback_that_raises_does_not_stop_the_table(kafka: str) -> None:
    topic = "table-callback"
    await _produce(kafka, topic, [(b"a", encode(1, 1, "a")), (b"b", encode(1, 1, "b"))])
    table, registry = _table(kafka, topic)

    def broken(change: Change[Row]) -> None:
        raise RuntimeError("a bug in a consumer of the table")

    table.subscribe(broken)
    await table.start()
    try:
        async with asyncio.timeout(30):
            await table.wait_caught_up()
    finally:
        await table.stop()
    assert len(table) == 2
    assert registry.get_sample_value("sidecar_fleet_table_callback_errors_total", {"table": "t"}) == 2


async def test_a_missing_topic_is_not_caught_up_until_it_exists(tansu: TansuBroker) -> None:
    topic = "table-later"
    table, _ = _table(tansu.bootstrap_servers, topic)
    await table.start()
    try:
        await asyncio.sleep(2)
        assert not table.caught_up
        health = table.health()
        assert not health.ready
        assert "reading the topic" in health.detail
        await tansu.create_topics([topic], 1)
        await _produce(tansu.bootstrap_servers, topic, [(b"a", encode(1, 1, "a"))])
        await _until(lambda: table.get("a") == Row(1, 1, "a"), 60)
        assert table.caught_up
    finally:
        await table.stop()


async def test_a_missing_table_topic_is_created_compacted_once(tansu: TansuBroker) -> None:
    from sidecar.fleet.topics import ensure_compacted_topic

    cfg = KafkaConfig(bootstrap_servers=tansu.bootstrap_servers)
    assert await ensure_compacted_topic(cfg, "table-created", replication_factor=1)
    assert await ensure_compacted_topic(cfg, "table-created", replication_factor=1)  # exists: fine
    table, _ = _table(tansu.bootstrap_servers, "table-created")
    await table.start()
    try:
        async with asyncio.timeout(30):
            await table.wait_caught_up()  # an empty topic is caught up at once
    finally:
        await table.stop()


async def test_topic_creation_refused_is_reported_not_raised(kafka: str) -> None:
    from sidecar.fleet.topics import ensure_compacted_topic

    # librdkafka's mock cluster has no controller for CreateTopics.
    assert not await ensure_compacted_topic(KafkaConfig(bootstrap_servers=kafka), "nope", replication_factor=1)
