"""The OTLP-on-Kafka bridge killed mid-stream: a real ``sidecar run`` process (bridge on, scoring
off) reads Collector-shaped records (opentelemetry-proto, both encodings, single traces keyed by
trace id and unkeyed batches, one conversation's traces spread over partitions) from librdkafka's
mock cluster in a helper process while records keep arriving, and is SIGKILLed and SIGTERMed and
restarted. Afterwards:

* nothing is missing: each conversation's events, after the sidecar's dedup, are exactly what a
  native producer would have sent, and every turn's hooks fired exactly once;
* every repeat is a copy with the same event id, which the sidecar drops as ``duplicate_event``
  (never a ``duplicate_seq`` or a ``seq_gap``);
* repeats are bounded by what was in flight: the spans whose events were produced by two runs are
  at most one poll's worth per restart.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter, defaultdict
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from sidecar.tools.demo.mock_cluster import MockKafkaCluster
from tests.integration.kafka_support import SidecarProcess, read_topic, result_keys, write_config
from tests.otel.spans import conversation, decoded, dedup, model_calls, native_events
from tests.otel.test_kafka import collector_records

TOPIC = "bk"  # the events topic
OTLP = "bk-otlp"
GROUP = "bk-bridge"
POLL_RECORDS = 4  # otel.bridge.fetch_max_records: small, so that a run spans many polls
TRACES_PER_RECORD = 5  # the most collector_records batches into one record
STOPS = ("kill", "term")


async def end_offsets(bootstrap: str, topic: str) -> dict[int, int]:
    c = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None)
    await c.start()
    try:
        parts = c.partitions_for_topic(topic) or set()
        if not parts:
            await c._client.force_metadata_update()
            parts = c.partitions_for_topic(topic) or set()
        ends = await c.end_offsets([TopicPartition(topic, p) for p in parts])
        return {tp.partition: off for tp, off in ends.items()}
    finally:
        await c.stop()


class EndOffsets:
    """The events topic's end offsets, read by one long-lived client (a fresh one per read costs
    several round trips: too slow to catch a poll in flight)."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self._topic = topic
        self._c = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None)

    async def start(self) -> None:
        await self._c.start()

    async def ends(self) -> dict[int, int]:
        parts = self._c.partitions_for_topic(self._topic)
        if not parts:
            await self._c._client.force_metadata_update()
            parts = self._c.partitions_for_topic(self._topic) or set()
        if not parts:
            return {}
        got = await self._c.end_offsets([TopicPartition(self._topic, p) for p in parts])
        return {tp.partition: off for tp, off in got.items()}

    async def stop(self) -> None:
        await self._c.stop()


async def committed(bootstrap: str, group: str, topic: str, partitions: list[int]) -> dict[int, int]:
    c = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
    await c.start()
    try:
        got = await c._coordinator.fetch_committed_offsets([TopicPartition(topic, p) for p in partitions])
        return {tp.partition: om.offset for tp, om in got.items()}
    finally:
        await c.stop()


@pytest.mark.slow
async def test_the_bridge_killed_mid_stream_loses_nothing_and_repeats_only_in_flight(tmp_path: Path) -> None:
    rng = random.Random(20261127)
    histories = {f"k-{i}": conversation(rng.randint(1, 4), tag=str(i)) for i in range(36)}
    records = collector_records(histories, rng)
    chat_spans = sum(len(model_calls(h)) for h in histories.values())

    with MockKafkaCluster(1, rtt_ms=50) as kafka:  # a step takes round trips: stops land inside one
        bs = kafka.bootstrap_servers
        cfg = write_config(
            tmp_path / "sidecar.yaml",
            bs,
            TOPIC,
            otel={"bridge": {"enabled": True, "topic": OTLP, "group_id": GROUP, "fetch_max_records": POLL_RECORDS}},
            state={"turn_debounce_seconds": 0.5},
        )
        log_path = tmp_path / "sidecar.log"
        sidecar = SidecarProcess(cfg, log_path)
        running = asyncio.Event()  # the Collector writes while a sidecar is up: every stop is mid-stream

        async def collector() -> None:
            producer = AIOKafkaProducer(bootstrap_servers=bs, acks="all")
            await producer.start()
            try:
                for start in range(0, len(records), 3):
                    await running.wait()
                    sent = [await producer.send(OTLP, value=v, key=k) for k, v in records[start : start + 3]]
                    await asyncio.gather(*sent)
                    await asyncio.sleep(0.3)
            finally:
                await producer.stop()

        async def started(runs: int) -> None:
            while (await asyncio.to_thread(log_path.read_text)).count('"sidecar.started"') < runs:
                assert sidecar.alive(), log_path.read_text()[-3000:]
                await asyncio.sleep(0.2)

        watch = EndOffsets(bs, TOPIC)
        await watch.start()
        producing = asyncio.create_task(collector())
        sidecar.start()
        run_ends: list[dict[int, int]] = [{}]  # the events topic's end offsets at each stop
        try:
            for run, how in enumerate(STOPS, start=1):
                await started(run)
                running.set()
                # Stop once this run has derived events (its bridge is mid-stream): a kill at once, while
                # that poll's produce or commit is likely in flight; a SIGTERM a little later.
                before = sum(run_ends[-1].values())
                while not producing.done() and sum((await watch.ends()).values()) == before:  # noqa: ASYNC110 - another process
                    await asyncio.sleep(0.01)
                if how == "term":
                    await asyncio.sleep(rng.uniform(0.2, 1.5))
                if how == "kill":
                    sidecar.kill()
                else:
                    assert sidecar.terminate() == 0, log_path.read_text()[-3000:]
                running.clear()
                await asyncio.sleep(0.5)  # anything the dead process had on the wire has landed
                run_ends.append(await end_offsets(bs, TOPIC))
                sidecar.start()
            await started(len(STOPS) + 1)
            running.set()
            await producing
            otlp_ends = await end_offsets(bs, OTLP)
            for _ in range(240):  # the bridge commits every record; then the source catches up
                if await committed(bs, GROUP, OTLP, list(otlp_ends)) == otlp_ends:
                    break
                await asyncio.sleep(0.5)
            else:
                raise AssertionError("the bridge did not catch up")
            expected = Counter(
                (cid, t, kind)
                for cid, h in histories.items()
                for t in range(1, sum(m["role"] == "user" for m in h) + 1)
                for kind in ("user_message", "turn_closed")
            )
            got: Counter[tuple[str, int, str]] = Counter()
            for _ in range(120):
                got = Counter(result_keys(await read_topic(bs, f"{TOPIC}.results", idle_seconds=0.3)))
                if set(got) >= set(expected):
                    break
                await asyncio.sleep(0.5)
            assert sidecar.alive(), log_path.read_text()[-3000:]
        finally:
            producing.cancel()
            sidecar.terminate()
            await watch.stop()
        produced = await read_topic(bs, TOPIC, idle_seconds=0.5)
        dead = await read_topic(bs, f"{TOPIC}.dlq", idle_seconds=0.5)

    # Nothing missing, every repeat the same event: dedup() fails on a seq taken by another event id.
    logs = dedup(decoded((r.key, r.value) for r in produced))
    assert set(logs) == set(histories)
    for cid, history in histories.items():
        assert [e.message for e in logs[cid]] == [e.message for e in native_events(cid, history)], cid
    assert got == expected  # every turn's hooks exactly once
    reasons = Counter(dict(r.headers)["dlq.reason"].decode() for r in dead)
    assert set(reasons) <= {"duplicate_event"}, reasons

    # Which run produced each event: the events topic's end offsets at each stop cut it into runs.
    runs_of_span: defaultdict[tuple[str, str], set[int]] = defaultdict(set)
    for r, event in zip(produced, decoded((r.key, r.value) for r in produced), strict=True):
        run = next((k for k, ends in enumerate(run_ends[1:]) if r.offset < ends.get(r.partition, 0)), len(STOPS))
        assert event.span is not None
        runs_of_span[(event.span.trace_id, event.span.span_id)].add(run)
    reprocessed = sum(1 for runs in runs_of_span.values() if len(runs) > 1)
    repeats = len(produced) - sum(len(log) for log in logs.values())
    print(
        f"\n{len(records)} OTLP records, {chat_spans} chat spans, {sum(len(h) for h in histories.values())} "
        f"messages; {len(STOPS)} stops; {len(produced)} events produced, {repeats} repeats "
        f"(dead-lettered duplicate_event: {reasons['duplicate_event']}); "
        f"{reprocessed} chat spans derived in two runs"
    )
    assert reasons["duplicate_event"] >= repeats  # dead letters are at-least-once: a kill can write one twice
    assert reprocessed <= len(STOPS) * POLL_RECORDS * TRACES_PER_RECORD
    assert all(sum(run_ends[k].values()) > sum(run_ends[k - 1].values()) for k in range(1, len(run_ends)))
    assert repeats > 0  # conversations went on across restarts (their next spans are re-derived in full)
