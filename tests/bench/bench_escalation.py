"""Escalation freshness: user message to uncertainty verdict, and to alert, at the demo's rate and
at 2x overload, on the real pipeline (mock Kafka, the sidecar in-process, the bundled model on a
real vLLM CPU server, alerts to a Kafka topic).

    .venv/bin/python -m tests.bench.bench_escalation --conversations 40 --rates 4,8

For each rate it replays the bundled sample (fresh conversation ids) at that many events per
second, waits for the pipeline to drain, and reads back:

* verdict latency: the results record of each user turn's tree (its Kafka timestamp) minus the
  user message's own record timestamp, for every tree computed, p50 / p95;
* alert latency: ``created_at - triggered_at`` of every ``uncertain_turn`` alert, p50 / p95;
* how many trees were shed as stale or superseded (fresh work first under overload).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np

from sidecar.app import run_app
from sidecar.config import load_config
from sidecar.tools.demo import models
from sidecar.tools.demo.mock_cluster import MockKafkaCluster
from sidecar.tools.demo.replay import conversation_events, interleave, load_sample, produce
from tests.integration.kafka_support import read_topic


def _ts(iso: str | None) -> float | None:
    return None if iso is None else datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def _pcts(values: list[float]) -> dict[str, float | int]:
    if not values:
        return {"n": 0}
    return {
        "n": len(values),
        "p50": round(float(np.percentile(values, 50)), 2),
        "p95": round(float(np.percentile(values, 95)), 2),
        "max": round(max(values), 2),
    }


async def one_rate(bootstrap: str, url: str, rate: float, n: int, tmp: Path) -> dict[str, Any]:
    topic = f"bench-{uuid.uuid4().hex[:8]}"
    base, adapter = models.bundled_model() or (None, None)
    assert base is not None and adapter is not None
    overrides = {
        "kafka": {
            "bootstrap_servers": bootstrap,
            "topic": topic,
            "group_id": f"g-{topic}",
            "results_topic": f"{topic}.results",
            "dead_letter_topic": f"{topic}.dlq",
        },
        "http": {"host": "127.0.0.1", "port": 0},
        "logging": {"level": "warning", "format": "json"},
        "state": {"turn_debounce_seconds": 5},
        "scoring": models.demo_scoring_config(f"{url}/v1", base, adapter),
        "alerting": {"enabled": True, "sinks": {"kafka": {"enabled": True, "topic": f"{topic}.alerts"}}},
    }
    config = load_config(None, overrides=overrides)
    stop, ready = asyncio.Event(), asyncio.Event()
    app = asyncio.create_task(run_app(config, ready=ready, stop=stop))
    await asyncio.wait_for(ready.wait(), 120)
    convs = [conversation_events(r, conversation_id=f"{r['conversation_id']}#{topic}") for r in load_sample()[:n]]
    events = list(interleave(convs, concurrency=10, seed=1))
    t0 = time.monotonic()
    await produce(bootstrap, topic, events, rate=rate, stamp_now=True)
    produced_s = time.monotonic() - t0
    expected_trees = sum(1 for e in events if e.get("message", {}).get("role") == "user")
    deadline = time.monotonic() + 900
    results: list[Any] = []
    while time.monotonic() < deadline:
        await asyncio.sleep(5)
        results = await read_topic(bootstrap, f"{topic}.results")
        if sum(1 for r in results if json.loads(r.value).get("kind") == "user_message") >= expected_trees:
            break
    stop.set()
    await app
    source = {(r.partition, r.offset): r.timestamp for r in await read_topic(bootstrap, topic)}
    verdicts, shed = [], {"stale": 0, "superseded": 0}
    for r in results:
        rec = json.loads(r.value)
        if rec.get("kind") != "user_message":
            continue
        out = rec.get("outcome", {}).get("scoring", {})
        if "leaves" in out:
            verdicts.append((r.timestamp - source[(rec["partition"], rec["position"])]) / 1000.0)
        elif out.get("skipped") in shed:
            shed[out["skipped"]] += 1
    alerts = [json.loads(r.value) for r in await read_topic(bootstrap, f"{topic}.alerts")]
    alert_lat = [
        _ts(a["created_at"]) - _ts(a["triggered_at"])  # type: ignore[operator]
        for a in alerts
        if a["kind"] == "uncertain_turn" and a["triggered_at"]
    ]
    return {
        "rate_events_per_s": rate,
        "events": len(events),
        "user_turns": expected_trees,
        "produce_seconds": round(produced_s, 1),
        "verdict_latency_seconds": _pcts(verdicts),
        "uncertain_turn_alert_latency_seconds": _pcts(alert_lat),
        "trees_shed": shed,
        "alerts": {k: sum(a["kind"] == k for a in alerts) for k in {a["kind"] for a in alerts}},
    }


async def main(args: argparse.Namespace) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp())
    server = None
    url = args.url
    if url is None:
        server = models.local_server(tmp / "vllm.log")
        server.start()
        await server.wait_ready()
        url = server.root_url
    try:
        with MockKafkaCluster(1) as kafka:
            out = []
            for rate in args.rates:
                res = await one_rate(kafka.bootstrap_servers, url.rstrip("/"), rate, args.conversations, tmp)
                print(json.dumps(res), file=sys.stderr, flush=True)
                out.append(res)
            return {"conversations": args.conversations, "runs": out}
    finally:
        if server is not None:
            server.stop()


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--conversations", type=int, default=40)
    p.add_argument("--rates", type=lambda s: [float(x) for x in s.split(",")], default=[4.0, 8.0])
    p.add_argument("--url", default=None, help="root URL of a running server with the bundled model")
    p.add_argument("--out", type=Path, default=None)
    a = p.parse_args()
    result = asyncio.run(main(a))
    text = json.dumps(result, indent=2)
    print(text)
    if a.out is not None:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(text + "\n", encoding="utf-8")
