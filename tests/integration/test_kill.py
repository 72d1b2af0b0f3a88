"""The restart-safety proof: a producer streams real conversations while the sidecar process is
SIGKILLed at random moments and restarted; at the end every hook outcome in the results topic
matches the ground truth exactly (none missing, none twice), and every bad record reached the
dead-letter topic.

The conversations are the bundled demo sample (STAR, MultiWOZ, tau-bench) replayed seven times
under fresh ids, so the test needs nothing beyond the repository."""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections import Counter
from pathlib import Path

from sidecar.tools.demo.mock_cluster import MockKafkaCluster
from sidecar.tools.demo.replay import encode, interleave
from tests.integration.kafka_support import (
    SidecarProcess,
    ground_truth,
    produce_raw,
    read_topic,
    result_keys,
    sample_conversations,
    write_config,
)

KILLS = 6
COPIES = 7  # of the 300 bundled conversations
BAD_RECORDS = 60


def bad_record(i: int, rng: random.Random) -> tuple[bytes | None, bytes]:
    marker = f"BAD-{i:04d}"
    kind = i % 5
    if kind == 0:
        return b"k", f"{{not json {marker}".encode()
    if kind == 1:
        return b"k", b"\xff\xfe" + marker.encode()
    if kind == 2:
        return marker.encode(), json.dumps({"conversation_id": marker, "seq": "zero"}).encode()
    if kind == 3:
        return b"wrong-key", json.dumps(
            {
                "conversation_id": marker,
                "event_id": marker,
                "seq": 0,
                "ts": 1,
                "type": "message",
                "message": {"role": "user", "content": "x"},
            }
        ).encode()
    return marker.encode(), json.dumps(
        {
            "conversation_id": marker,
            "event_id": marker,
            "seq": rng.randint(3, 9),
            "ts": 1,
            "type": "message",
            "message": {"role": "user", "content": "gap"},
        }
    ).encode()


async def test_sigkill_at_random_moments_loses_and_repeats_nothing(tmp_path: Path) -> None:
    rng = random.Random(20261122)
    convs = sample_conversations(COPIES, "kill")
    assert len(convs) >= 2000
    expected = ground_truth(convs)
    stream: list[tuple[bytes | None, bytes]] = [encode(e) for e in interleave(convs, concurrency=300, seed=7)]
    for i in range(BAD_RECORDS):
        stream.insert(rng.randrange(len(stream)), bad_record(i, rng))

    with MockKafkaCluster(1) as kafka:
        bs = kafka.bootstrap_servers
        cfg = write_config(tmp_path / "sidecar.yaml", bs, "kill", state={"turn_debounce_seconds": 0.5})
        sidecar = SidecarProcess(cfg, tmp_path / "sidecar.log")

        async def producer() -> None:
            chunk = 1000
            for start in range(0, len(stream), chunk):
                await produce_raw(bs, "kill", stream[start : start + chunk])
                await asyncio.sleep(0.4)

        producing = asyncio.create_task(producer())
        sidecar.start()
        kill_times = []
        try:
            for _ in range(KILLS):
                await asyncio.sleep(rng.uniform(2.0, 9.0))
                sidecar.kill()
                kill_times.append(time.monotonic())
                sidecar.start()
            await producing
            deadline = time.monotonic() + 300
            got: Counter[tuple[str, int, str]] = Counter()
            while time.monotonic() < deadline:
                await asyncio.sleep(3)
                got = Counter(result_keys(await read_topic(bs, "kill.results")))
                if set(got) >= set(expected):
                    break
            assert sidecar.alive(), (tmp_path / "sidecar.log").read_text()[-3000:]
        finally:
            producing.cancel()
            sidecar.terminate()
        got = Counter(result_keys(await read_topic(bs, "kill.results")))
        dlq = await read_topic(bs, "kill.dlq")

    missing = expected - got
    duplicated = {k: v for k, v in got.items() if v > 1}
    unexpected = set(got) - set(expected)
    assert len(kill_times) == KILLS
    assert not missing, f"{sum(missing.values())} outcomes missing, e.g. {list(missing)[:5]}"
    assert not duplicated, f"{len(duplicated)} outcomes recorded twice, e.g. {list(duplicated.items())[:5]}"
    assert not unexpected, f"unexpected outcomes, e.g. {list(unexpected)[:5]}"
    assert got == expected
    dead = "\n".join(
        ((r.value or b"").decode("utf-8", "replace") + (r.key or b"").decode("utf-8", "replace")) for r in dlq
    )
    reasons = Counter(dict(r.headers)["dlq.reason"].decode() for r in dlq)
    assert all(f"BAD-{i:04d}" in dead or (i % 5 == 1) for i in range(BAD_RECORDS)), reasons
    assert reasons["invalid_utf8"] >= BAD_RECORDS // 5
