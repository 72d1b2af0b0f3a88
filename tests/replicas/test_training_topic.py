"""Shared training data for real: three ``sidecar run`` processes in one group on Tansu write the
training topic (``training_store.backend: kafka``), one dies with SIGKILL mid-stream, and
``adapters onboard``'s reader (``kafka-training://``) sees every finished conversation of the
replayed sample exactly once.

Scoring is off (the recording hooks still fire every ``conversation_ended`` effect through the
post-score stage), so no vLLM is needed. The conversations are the bundled sample under fresh ids,
interleaved so that many are open on the killed replica when it dies: their ends are fired by the
partitions' new owners, and an end the killed replica had written but not yet journalled is
written again under the same key, which the reader counts once.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from pathlib import Path
from typing import Any

from adapters.data.sources import open_source, source_limits
from sidecar.tools.demo.replay import conversation_events, encode, interleave, load_sample
from tests.integration.kafka_support import produce_raw, read_topic
from tests.replicas.fleet import Fleet
from tests.support.tansu import TansuBroker

PARTITIONS = 6
CONVERSATIONS = 60
TOPIC = "fleet-train"
TRAINING = f"{TOPIC}.training"
AGENT = "shop"


def _onboarding_reads(bootstrap: str) -> tuple[list[str], dict[str, Any]]:
    """What ``adapters onboard --source kafka-training://... --agent shop`` reads (its own event loop)."""
    source = open_source(f"kafka-training://{bootstrap}/{TRAINING}", agent=AGENT, limits=source_limits(1 << 30))
    return [c.conversation_id for c in source.conversations()], source.describe()


def _written(fleet: Fleet) -> float:
    total = 0.0
    for r in fleet.live():
        s = r.scrape()
        if s is not None:
            total += s.value("sidecar_training_store_conversations_total", result="written")
    return total


async def test_three_replicas_write_one_training_topic_read_once_per_conversation_after_a_kill(
    tansu: TansuBroker, tmp_path: Path
) -> None:
    bs = tansu.bootstrap_servers
    await tansu.create_topics([TOPIC, f"{TOPIC}.results", f"{TOPIC}.dlq"], PARTITIONS)
    ids = [f"train-{i}" for i in range(CONVERSATIONS)]
    convs = [
        conversation_events(r, agent=AGENT, conversation_id=cid)
        for cid, r in zip(ids, load_sample()[:CONVERSATIONS], strict=True)
    ]
    stream = [encode(e) for e in interleave(convs, concurrency=20, seed=11)]
    half = len(stream) // 2
    fleet = Fleet(
        tmp_path,
        bs,
        TOPIC,
        PARTITIONS,
        {
            "scoring": {"enabled": False},
            # The sidecar creates the topic itself (compacted, one partition) on its first write.
            "training_store": {"enabled": True, "backend": "kafka", "replication_factor": 1},
        },
    )
    try:
        for name in ("a", "b", "c"):
            fleet.start(name)
        owned = await fleet.settled(180)
        assert set(owned) == {"a", "b", "c"}
        await produce_raw(bs, TOPIC, stream[:half])
        await fleet.wait(lambda: _written(fleet) >= 5, 120, "the first training records")

        active: dict[str, float] = {}

        def some_open() -> bool:  # a scrape can time out on a loaded machine: read again
            scrapes = {r.name: r.scrape() for r in fleet.live()}
            active.update({n: s.value("sidecar_conversations_active") for n, s in scrapes.items() if s is not None})
            return any(v > 0 for v in active.values())

        await fleet.wait(some_open, 60, "a replica with open conversations")
        victim = fleet.replicas[max(active, key=lambda n: active[n])]
        open_at_kill = active[victim.name]
        assert open_at_kill > 0, active  # it dies with conversations begun and not yet ended
        victim.proc.kill()  # mid-stream: its open conversations end on the partitions' new owners
        await produce_raw(bs, TOPIC, stream[half:])
        final = await fleet.settled(180)
        assert victim.name not in final

        loop = asyncio.get_running_loop()
        deadline = loop.time() + 180
        while True:
            got, described = await asyncio.to_thread(_onboarding_reads, bs)
            if len(set(got)) >= len(ids) or loop.time() > deadline:
                break
            await asyncio.sleep(2)
        raw = await read_topic(bs, TRAINING)
    finally:
        fleet.stop_all()

    assert len(got) == len(set(got)), Counter(got).most_common(3)  # each conversation once
    assert sorted(got) == sorted(ids)
    # Every record is one whole conversation of the sample, under the key the reader deduplicated by.
    keys = Counter(r.key for r in raw)
    assert set(keys) == {f"{AGENT}/{cid}".encode() for cid in ids}
    by_id = {r["conversation_id"]: r for r in (json.loads(x.value) for x in raw)}
    sample = dict(zip(ids, load_sample()[:CONVERSATIONS], strict=True))
    assert all(len(by_id[cid]["turns"]) == len(sample[cid]["turns"]) for cid in ids)
    assert described["malformed"] == 0
    print(  # the figures of the run, for the record
        f"records={len(raw)} conversations={len(set(got))} repeats={len(raw) - len(keys)} "
        f"open_on_killed_replica={open_at_kill:g}"
    )
