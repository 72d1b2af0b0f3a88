"""The fault suite: every way the sidecar process stops, and hostile input from outside, against
librdkafka's mock cluster. At the end the results topic holds exactly one outcome per
(conversation, turn, kind) of the ground truth: nothing missing, nothing twice.

The subject is ``tests.integration.fault_sidecar``: ``sidecar run`` whose hooks answer up to
``DELAY_MAX`` seconds late with at most 4 effects in flight per partition, so every stop lands
while a backlog of effects is pending. Faults, in a seeded random order at random moments:

* SIGTERM (graceful stop: drain, abandon, flush, commit) and restart;
* SIGKILL and restart;
* a rebalance while running: a second group member joins and leaves (on the mock cluster its
  SyncGroup fails, but the sidecar still goes through revoke -> partial assign -> revoke ->
  assign, in the same process);
* a producer that re-sends finished conversations (every event again, same ids), before and
  after restarts;
* poison records in the source topic (bad JSON, invalid UTF-8, wrong key, a header key that is
  not UTF-8) and in the results topic (``1e999``, 100,000 nested brackets, and forged outcomes and
  transitions that would suppress hooks or end conversations if they were trusted: the sidecar
  runs with a journal signing key);
* and, in the second test, a slow broker (100 ms round trip on every request).
"""

from __future__ import annotations

import asyncio
import json
import random
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from sidecar.source.journal_entry import JournalSigner
from sidecar.tools.demo.mock_cluster import MockKafkaCluster
from sidecar.tools.demo.replay import encode, interleave
from sidecar.tools.ports import free_port
from tests.integration.kafka_support import (
    SidecarProcess,
    ground_truth,
    http_get,
    produce_raw,
    produce_with_header_key,
    read_topic,
    result_keys,
    sample_conversations,
    write_config,
)

KEY = "fault-suite-signing-key"
DELAY_MAX = 0.05
FAULT_ARGV = ["-m", "tests.integration.fault_sidecar", "--delay-max", str(DELAY_MAX)]


def poison_source(n: int) -> list[tuple[bytes | None, bytes]]:
    out: list[tuple[bytes | None, bytes]] = []
    for i in range(n):
        marker = f"POISON-{i:03d}"
        kind = i % 4
        if kind == 0:
            out.append((b"k", f"{{not json {marker}".encode()))
        elif kind == 1:
            out.append((b"k", b"\xff\xfe" + marker.encode()))
        elif kind == 2:
            out.append((marker.encode(), json.dumps({"conversation_id": marker, "seq": "zero"}).encode()))
        else:
            out.append((marker.encode(), ("[" * 100_000).encode()))
    return out


def forged_results(topic: str, group: str, victims: list[str]) -> list[dict[str, Any]]:
    """Unsigned records that, if trusted, would suppress real hooks and end open conversations."""
    forged: list[dict[str, Any]] = []
    for p in range(4):
        for cid in victims:
            base = {"v": 1, "group": group, "topic": topic, "partition": p, "conversation_id": cid}
            forged.append({**base, "position": 10**9, "trigger": "record", "kind": "user_message", "turn": 1})
            forged.append({**base, "position": 0, "trigger": "timer", "kind": "conversation_ended", "turn": 0})
    return forged


async def write_results_poison(bs: str, topic: str, records: list[bytes]) -> None:
    # Batched (linger): the mock broker answers one batch per fetch, so one batch per record would
    # make every later journal read cost one round trip per junk record.
    producer = AIOKafkaProducer(bootstrap_servers=bs, acks="all", linger_ms=50, max_request_size=4_194_304)
    await producer.start()
    try:
        futures = [await producer.send(topic, value=v, key=b"x", partition=p) for p in range(4) for v in records]
        await asyncio.gather(*futures)
    finally:
        await producer.stop()


async def polling(port: int, within: float = 120.0) -> None:
    """Wait until the sidecar on ``port`` is a member of its group and polling."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while loop.time() < deadline:
        try:
            _, body = await asyncio.to_thread(http_get, f"http://127.0.0.1:{port}/readyz")
            kafka = next(c for c in json.loads(body)["checks"] if c["name"] == "kafka")
            if "polling=True" in kafka["detail"] and "partitions=0" not in kafka["detail"]:
                return
        except (OSError, ValueError, StopIteration):
            pass
        await asyncio.sleep(0.2)
    raise AssertionError(f"the sidecar on port {port} did not start polling")


async def rebalance(bs: str, group: str, topic: str, linger_seconds: float) -> None:
    """Join the sidecar's group as a second member for a while, then leave."""
    joiner = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bs,
        group_id=group,
        enable_auto_commit=False,
        session_timeout_ms=6000,
        heartbeat_interval_ms=1000,
    )
    try:
        await asyncio.wait_for(joiner.start(), linger_seconds)
        await asyncio.sleep(linger_seconds)
    except Exception:  # on the mock cluster a second member's SyncGroup fails; the rebalance happened anyway
        pass
    finally:
        await joiner.stop()


async def run_scenario(
    tmp_path: Path,
    *,
    name: str,
    copies: int,
    faults: list[str],
    rtt_ms: int,
    seed: int,
    limit: int | None = None,
    max_pending: int = 4,
) -> None:
    rng = random.Random(seed)
    convs = sample_conversations(copies, name, limit)
    expected = ground_truth(convs)
    stream: list[tuple[bytes | None, bytes]] = [encode(e) for e in interleave(convs, concurrency=120, seed=seed)]
    poison = poison_source(24)
    for p in poison:
        stream.insert(rng.randrange(len(stream)), p)
    resent = [[encode(e) for e in c] for c in rng.sample(convs, min(30, len(convs) // 4))]
    n_resent = len(resent)
    results_topic = f"{name}.results"
    signer = JournalSigner([KEY.encode()])

    port = free_port()
    with MockKafkaCluster(1, rtt_ms=rtt_ms) as kafka:
        bs = kafka.bootstrap_servers
        group = f"g-{name}"
        victims = [c[0]["conversation_id"] for c in convs[:20]]
        junk = [b"1e999", b'{"v":1,"kind":"user_message","turn":1e999,"position":1}', b"[" * 100_000, b"\xff\xfe"]
        junk += [json.dumps(r).encode() for r in forged_results(name, group, victims)]
        await write_results_poison(bs, results_topic, junk)
        cfg = write_config(
            tmp_path / f"{name}.yaml",
            bs,
            name,
            kafka={
                "max_pending_effects_per_partition": max_pending,
                "journal_signing_keys": [KEY],
                "revoke_grace_seconds": 0.3,
                "fetch_max_records": 200,
            },
            state={"turn_debounce_seconds": 0.5},
            http={"port": port},
        )
        sidecar = SidecarProcess(cfg, tmp_path / f"{name}.log", argv=FAULT_ARGV)

        async def producer() -> None:
            chunk = 400
            for start in range(0, len(stream), chunk):
                await produce_raw(bs, name, stream[start : start + chunk])
                await asyncio.sleep(0.5)
                if start and start % (4 * chunk) == 0 and resent:
                    await produce_raw(bs, name, resent.pop())  # a finished (or finishing) one, again
            await asyncio.to_thread(produce_with_header_key, bs, name, b"hk", b'{"x": 1}', b"\xff\xfe\xfd")
            for events in resent:
                await produce_raw(bs, name, events)

        producing = asyncio.create_task(producer())
        sidecar.start()
        done_faults: list[str] = []
        try:
            for fault in faults:
                await asyncio.sleep(rng.uniform(3.0, 7.0))
                if fault == "term":
                    code = sidecar.terminate(timeout=60)
                    # A SIGTERM can land before the interpreter reaches the handler that makes a
                    # stop during start-up clean (a loaded node: seconds). Such a process has read
                    # nothing and written nothing, so it has nothing to lose; any other stop is 0.
                    early = code == -signal.SIGTERM and not sidecar.said_anything()
                    assert code == 0 or early, (tmp_path / f"{name}.log").read_text()[-3000:]
                    sidecar.start()
                elif fault == "kill":
                    sidecar.kill()
                    sidecar.start()
                else:
                    # A second member joins the running sidecar's group. (On the mock cluster the
                    # member that syncs second fails; that must be the joiner, not a sidecar still
                    # joining after a restart, which would crash as librdkafka's mock answers it
                    # InvalidRequestError, unlike a real broker.)
                    await polling(port)
                    await rebalance(bs, group, name, linger_seconds=3.0)
                done_faults.append(fault)
            await producing
            deadline = time.monotonic() + 240
            got: Counter[tuple[str, int, str]] = Counter()
            while time.monotonic() < deadline:
                await asyncio.sleep(3)
                got = Counter(result_keys(await read_topic(bs, results_topic), signer))
                if set(got) >= set(expected):
                    break
            await asyncio.sleep(2)  # anything late would land now
            assert sidecar.alive(), (tmp_path / f"{name}.log").read_text()[-3000:]
        finally:
            producing.cancel()
            code = sidecar.terminate(timeout=60)
        assert code == 0
        results = await read_topic(bs, results_topic)
        dlq = await read_topic(bs, f"{name}.dlq")

    got = Counter(result_keys(results, signer))
    missing = expected - got
    duplicated = {k: v for k, v in got.items() if v > 1}
    assert done_faults == faults
    assert not missing, f"{sum(missing.values())} outcomes missing, e.g. {list(missing)[:5]}"
    assert not duplicated, f"{len(duplicated)} outcomes recorded twice, e.g. {list(duplicated.items())[:5]}"
    assert got == expected
    assert len(results) - sum(got.values()) == 4 * len(junk)  # only the injected junk is unsigned

    reasons = Counter(dict(r.headers)["dlq.reason"].decode() for r in dlq)
    dead = "\n".join(
        (r.value or b"")[:200].decode("utf-8", "replace") + (r.key or b"").decode("utf-8", "replace") for r in dlq
    )
    assert all(f"POISON-{i:03d}" in dead for i in range(len(poison)) if i % 4 != 1), reasons
    assert reasons["invalid_utf8"] >= len(poison) // 4
    assert reasons["unreadable_record"] >= 1
    # every re-sent event was refused (the conversation had finished, or it was still open and the
    # event a duplicate), never applied: had one been, the results would not equal the ground truth
    assert reasons["conversation_finished"] + reasons["duplicate_event"] >= n_resent


async def test_stops_rebalances_resends_and_poison_lose_and_repeat_nothing(tmp_path: Path) -> None:
    faults = ["term", "kill", "rebalance", "term", "term", "kill", "rebalance", "term"]
    random.Random(11).shuffle(faults)
    await run_scenario(tmp_path, name="fault", copies=2, faults=faults, rtt_ms=0, seed=11)


async def test_slow_broker_with_stops_loses_and_repeats_nothing(tmp_path: Path) -> None:
    await run_scenario(
        tmp_path, name="slow", copies=1, faults=["term", "kill", "term"], rtt_ms=100, seed=12, limit=120, max_pending=32
    )
