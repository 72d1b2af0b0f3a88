"""Feedback through SIGKILLs: conversations and judgements of their alerts (some sent twice) stream
into a sidecar that is killed at random moments and restarted; at the end every judgement is a row
of the judgement topic exactly once by key, with its verdict, the tally a replica reads from the
topic is exactly the ground truth (none lost, none counted twice), and the results topic journals
each feedback once."""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections import Counter
from pathlib import Path

from prometheus_client import CollectorRegistry

from sidecar.alerting.alert import alert_id
from sidecar.alerting.ledger import FeedbackLedger
from sidecar.alerting.thresholds import FeedbackThresholds, ThresholdMetrics, scale_for
from sidecar.config import load_config
from sidecar.telemetry.labels import AgentLabels
from sidecar.tools.demo.mock_cluster import MockKafkaCluster
from tests.integration.kafka_support import SidecarProcess, produce_raw, read_topic, write_config
from tests.integration.test_kafka_source import msg

KILLS = 4
CONVERSATIONS = 240
RESENT = 40
TOPIC = "fbkill"
GROUP = f"g-{TOPIC}"
FEEDBACK = {"adapt_thresholds": True, "min_judged_alerts": 20, "replication_factor": 1}


def judgement(cid: str, eid: str, rating: str) -> tuple[bytes, bytes]:
    body = {"target": "alert", "rating": rating, "turn": 1, "alert_id": alert_id(GROUP, cid, 1, "uncertain_turn")}
    ev = {"conversation_id": cid, "event_id": eid, "ts": 2.0, "type": "feedback", "feedback": body}
    return cid.encode(), json.dumps(ev).encode()


def stream(rng: random.Random) -> tuple[list[tuple[bytes, bytes]], dict[str, str]]:
    """Conversations, each followed (later, interleaved) by one judgement of its turn-1 alert;
    ``RESENT`` judgements sent a second time. Returns the records and event id -> verdict."""
    per_conv: list[list[tuple[bytes, bytes]]] = []
    truth: dict[str, str] = {}
    for i in range(CONVERSATIONS):
        cid = f"k{i}"
        rating = "true_alarm" if rng.random() < 0.3 else "false_alarm"
        truth[f"j-{cid}"] = rating
        records = [msg(cid, 0, "user"), msg(cid, 1, "assistant"), judgement(cid, f"j-{cid}", rating)]
        if i < RESENT:
            records.append(judgement(cid, f"j-{cid}", rating))
        records += [msg(cid, 2, "user"), msg(cid, 3, "assistant")]
        per_conv.append(records)
    out: list[tuple[bytes, bytes]] = []
    while per_conv:  # interleave, each conversation in its own order
        k = rng.randrange(len(per_conv))
        out.append(per_conv[k].pop(0))
        if not per_conv[k]:
            per_conv.pop(k)
    return out, truth


async def test_sigkill_mid_stream_loses_and_repeats_no_judgement(tmp_path: Path) -> None:
    rng = random.Random(20261129)
    records, truth = stream(rng)
    with MockKafkaCluster(1) as kafka:
        bs = kafka.bootstrap_servers
        path = write_config(tmp_path / "sidecar.yaml", bs, TOPIC, alerting={"feedback": FEEDBACK})
        sidecar = SidecarProcess(path, tmp_path / "sidecar.log")

        async def producer() -> None:
            for start in range(0, len(records), 60):
                await produce_raw(bs, TOPIC, records[start : start + 60])
                await asyncio.sleep(0.5)

        producing = asyncio.create_task(producer())
        sidecar.start()
        try:
            for _ in range(KILLS):
                await asyncio.sleep(rng.uniform(2.0, 6.0))
                sidecar.kill()
                sidecar.start()
            await producing
            deadline = time.monotonic() + 240
            journaled: Counter[str] = Counter()
            while time.monotonic() < deadline:
                await asyncio.sleep(3)
                results = await read_topic(bs, f"{TOPIC}.results")
                journaled = Counter(
                    json.loads(r.value)["outcome"]["event_id"]
                    for r in results
                    if json.loads(r.value)["kind"] == "feedback"
                )
                if set(journaled) >= set(truth):
                    break
            assert sidecar.alive(), (tmp_path / "sidecar.log").read_text()[-3000:]
            # The journal is complete; the rows are written before the commit passes, so give the
            # last ones a moment, then read the topic as a replica does.
            await asyncio.sleep(2)
        finally:
            producing.cancel()
            sidecar.terminate()
        rows = await read_topic(bs, f"{TOPIC}.alert-feedback")
        cfg = load_config(path)
        reader = FeedbackLedger(
            cfg.alerting,
            cfg.kafka,
            FeedbackThresholds(cfg.alerting.feedback, ThresholdMetrics(CollectorRegistry())),
            AgentLabels(),
            CollectorRegistry(),
        )
        await reader.start()
        try:
            await asyncio.wait_for(reader.table.wait_caught_up(), 60)
            tally = reader.thresholds.tally("shop", "uncertain_turn")
            scale = reader.thresholds.scale("shop", "uncertain_turn")
        finally:
            await reader.stop()

    assert sorted(journaled) == sorted(truth), "each feedback journaled"
    assert max(journaled.values()) == 1, "no feedback journaled twice"
    by_key = {r.key.decode(): json.loads(r.value)["verdict"] for r in rows}
    missing = set(truth) - set(by_key)
    assert not missing, f"{len(missing)} judgements lost, e.g. {sorted(missing)[:5]}"
    assert by_key == truth
    expected = (sum(v == "true_alarm" for v in truth.values()), sum(v == "false_alarm" for v in truth.values()))
    assert tally == expected  # counted once each, whatever was written again
    assert scale == scale_for(*expected, cfg.alerting.feedback) < 1.0
    rewritten = len(rows) - len(by_key)
    print(f"\n{len(truth)} judgements, {KILLS} kills: {len(rows)} rows written ({rewritten} written again)")
