"""Streaming-core benchmark. Prints three figures, each next to its target:

1. throughput: events/s through the sidecar (hooks = the no-op recorder, results journal on) vs. the
   minimum honest work in the same run (consume + decode + one produced outcome per hook) -> ratio
   (target >= 0.5), and per-event cost (target <= 40 us); a bare counting loop for reference;
2. memory: bytes per open conversation beyond its text, with 100,000 open conversations
   (target <= 2 KB);
3. latency: p99 from a record's fetch to the hook it triggers being called.

Run: ``.venv/bin/python -m tests.bench.bench_stream [--events 100000]``
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.structs import TopicPartition
from prometheus_client import CollectorRegistry

from sidecar.app import run_app
from sidecar.config import load_config
from sidecar.events import decode_event
from sidecar.state.config import StateConfig
from sidecar.state.hooks import RecordingHooks
from sidecar.state.store import PartitionState
from sidecar.tools.demo.mock_cluster import MockKafkaCluster
from sidecar.tools.demo.replay import conversation_events, encode, interleave, load_jsonl_gz, produce
from tests.integration.kafka_support import produce_raw, shared_dir


def real_events(target: int) -> list[tuple[bytes, bytes]]:
    records = load_jsonl_gz(shared_dir() / "datasets" / "multiwoz" / "dev.jsonl.gz")
    convs: list[list[dict[str, Any]]] = []
    total = 0
    i = 0
    while total < target:
        rec = records[i % len(records)]
        evs = conversation_events(rec, conversation_id=f"{rec['conversation_id']}#{i}")
        convs.append(evs)
        total += len(evs)
        i += 1
    return [encode(e) for e in interleave(convs, concurrency=500, seed=1)]


async def bare_loop(bs: str, topic: str, n: int, *, parse: bool = False) -> float:
    c = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bs,
        group_id=f"bench-bare-{parse}",
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        max_poll_records=500,
    )
    await c.start()
    got = 0
    t0 = 0.0
    try:
        while got < n:
            batch = await c.getmany(timeout_ms=500, max_records=500)
            if batch and not t0:
                t0 = time.perf_counter()
            for recs in batch.values():
                for r in recs:
                    if parse:
                        json.loads(r.value)
                    got += 1
        return n / (time.perf_counter() - t0)
    finally:
        await c.stop()


def hooks_of(value: bytes) -> int:
    """How many hook calls an event triggers (upper estimate without timers): a user message opens
    a turn (user_message) and closes the previous one (turn_closed); an end closes the last turn
    and ends the conversation."""
    ev = json.loads(value)
    if ev["type"] == "conversation_end":
        return 2
    if ev["message"]["role"] == "user":
        return 2 if ev["seq"] > 0 else 1
    return 0


async def honest_baseline(bs: str, topic: str, n: int) -> float:
    """The minimum honest work per event: consume it, decode and validate it with the sidecar's own
    decoder, and produce one small outcome record per hook it triggers (batched with the producer's
    batch API, as the sidecar's journal writer does). No state, no exactly-once bookkeeping."""
    c = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bs,
        group_id="bench-honest",
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        max_poll_records=2000,
    )
    p = AIOKafkaProducer(bootstrap_servers=bs, acks="all", enable_idempotence=True, linger_ms=5)
    await c.start()
    await p.start()
    got = 0
    t0 = 0.0
    pending: list[asyncio.Future[Any]] = []
    try:
        while got < n:
            batch = await c.getmany(timeout_ms=500, max_records=2000)
            if batch and not t0:
                t0 = time.perf_counter()
            for tp, recs in batch.items():
                builder = p.create_batch()
                for r in recs:
                    ev = decode_event(r.value, r.key, max_bytes=1_048_576)
                    for k in range(hooks_of(r.value)):
                        value = json.dumps(
                            {
                                "conversation_id": ev.conversation_id,
                                "seq": ev.seq,
                                "hook": k,
                                "outcome": {"recorded": True},
                            }
                        ).encode()
                        if builder.append(timestamp=None, key=r.key, value=value) is None:
                            pending.append(await p.send_batch(builder, f"{topic}.honest", partition=tp.partition))
                            builder = p.create_batch()
                            builder.append(timestamp=None, key=r.key, value=value)
                    got += 1
                if builder.record_count():
                    pending.append(await p.send_batch(builder, f"{topic}.honest", partition=tp.partition))
        await asyncio.gather(*pending)
        return n / (time.perf_counter() - t0)
    finally:
        await c.stop()
        await p.stop()


async def require_whole_topic(bs: str, topic: str) -> None:
    """Stop with the cause if the mock cluster has already dropped records (it keeps a bounded log
    per partition): every loop below waits for all ``n`` records and would wait forever."""
    c = AIOKafkaConsumer(bootstrap_servers=bs, group_id=None)
    await c.start()
    try:
        await c._client.force_metadata_update()
        tps = [TopicPartition(topic, p) for p in sorted(c.partitions_for_topic(topic) or ())]
        dropped = {tp.partition: off for tp, off in (await c.beginning_offsets(tps)).items() if off > 0}
    finally:
        await c.stop()
    if dropped:
        raise SystemExit(
            f"the mock cluster dropped the oldest records of partitions {dropped} (first offset "
            "kept): too many events for its log; run with fewer --events"
        )


def quantile_from_histogram(registry: CollectorRegistry, name: str, q: float) -> float:
    """Prometheus-style histogram_quantile over all label sets of ``name``."""
    buckets: dict[float, float] = {}
    for metric in registry.collect():
        if metric.name != name:
            continue
        for s in metric.samples:
            if s.name.endswith("_bucket"):
                le = float(s.labels["le"])
                buckets[le] = buckets.get(le, 0.0) + s.value
    edges = sorted(buckets)
    total = buckets[edges[-1]]
    rank = q * total
    prev_edge, prev_count = 0.0, 0.0
    for edge in edges:
        if buckets[edge] >= rank:
            if edge == float("inf"):
                return prev_edge
            frac = (rank - prev_count) / max(buckets[edge] - prev_count, 1e-9)
            return prev_edge + (edge - prev_edge) * frac
        prev_edge, prev_count = edge, buckets[edge]
    return prev_edge


async def sidecar_run(
    bs: str, topic: str, n: int, tmp: Path, rate: float | None = None, events: list[dict[str, Any]] | None = None
) -> tuple[float, float, float]:
    """Throughput (when the topic is pre-filled) or, with ``rate``, latency while producing live."""
    cfg_path = tmp / "bench.yaml"
    cfg_path.write_text(
        json.dumps(
            {
                "kafka": {
                    "bootstrap_servers": bs,
                    "topic": topic,
                    "group_id": f"bench-sidecar-{topic}",
                    "dead_letter_topic": f"{topic}.dlq",
                    "results_topic": f"{topic}.results",
                    "fetch_max_records": 2000,
                    "partition_queue_batches": 16,
                    "max_pending_effects_per_partition": 4096,
                },
                "http": {"host": "127.0.0.1", "port": 0},
                "logging": {"level": "warning"},
            }
        )
    )
    cfg = load_config(cfg_path)
    registry = CollectorRegistry()
    stop = asyncio.Event()
    ready = asyncio.Event()
    task = asyncio.create_task(run_app(cfg, hooks=RecordingHooks(), stop=stop, ready=ready, registry=registry))
    if rate is not None and events is not None:
        await ready.wait()
        await asyncio.sleep(5)  # partitions assigned and recovered
        await produce(bs, topic, events, rate=rate)
    consumed = 0.0
    t0 = 0.0
    while consumed < n:
        await asyncio.sleep(0.02)
        consumed = registry.get_sample_value("sidecar_events_consumed_total") or 0.0
        if consumed and not t0:
            t0 = time.perf_counter()
        if task.done():
            task.result()
    elapsed = time.perf_counter() - t0
    p50 = quantile_from_histogram(registry, "sidecar_hook_dispatch_seconds", 0.50)
    p99 = quantile_from_histogram(registry, "sidecar_hook_dispatch_seconds", 0.99)
    stop.set()
    await task
    return n / elapsed, p50, p99


def memory_per_conversation(n_convs: int) -> tuple[float, float]:
    """Bytes per open conversation beyond its text, and the mean text bytes, via tracemalloc."""
    records = load_jsonl_gz(shared_dir() / "datasets" / "multiwoz" / "dev.jsonl.gz")
    raws = []
    for i in range(n_convs):
        rec = records[i % len(records)]
        opened = conversation_events(rec, conversation_id=f"open-{i:06d}", end=False)[:4]
        raws.append([encode(e) for e in opened])
    state = PartitionState(StateConfig(max_conversations_per_partition=10 * n_convs))
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    offset = 0
    for pairs in raws:
        for key, value in pairs:
            state.apply(decode_event(value, key, max_bytes=1 << 20), offset, 0.0, 0)
            offset += 1
    gc.collect()
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    text = sum(sys.getsizeof(m.content) for c in state.conversations.values() for m in c.messages)
    text += sum(sys.getsizeof(c.conversation_id) for c in state.conversations.values())
    assert len(state) == n_convs
    return (after - before - text) / n_convs, text / n_convs


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=60_000)
    parser.add_argument("--open-conversations", type=int, default=100_000)
    parser.add_argument("--latency-events", type=int, default=20_000)
    parser.add_argument("--latency-rate", type=float, default=1000.0)
    args = parser.parse_args()
    events = real_events(args.events)
    n = len(events)

    with MockKafkaCluster(1) as kafka, tempfile.TemporaryDirectory() as tmp:
        bs = kafka.bootstrap_servers
        t = time.perf_counter()
        await produce_raw(bs, "bench", events)
        print(f"produced {n} events from MultiWOZ conversations in {time.perf_counter() - t:.1f} s")
        await require_whole_topic(bs, "bench")
        bare = await bare_loop(bs, "bench", n)
        bare_json = await bare_loop(bs, "bench", n, parse=True)
        honest = await honest_baseline(bs, "bench", n)
        side, _, _ = await sidecar_run(bs, "bench", n, Path(tmp))
        print(
            f"(1) throughput: sidecar {side:,.0f} events/s = {1e6 / side:.1f} us per event (target <= 40); "
            f"honest baseline (consume + decode + one batched outcome per hook) {honest:,.0f} events/s "
            f"-> ratio {side / honest:.2f} (target >= 0.5); bare aiokafka loop {bare:,.0f} events/s -> ratio "
            f"{side / bare:.2f}; bare loop that also json-parses each value {bare_json:,.0f} events/s -> ratio "
            f"{side / bare_json:.2f}",
            flush=True,
        )
        live = [json.loads(v) for _, v in real_events(args.latency_events)]
        for e in live:
            e["conversation_id"] = "live-" + e["conversation_id"]
            e["event_id"] = "live-" + e["event_id"]
        _, p50, p99 = await sidecar_run(bs, "live", len(live), Path(tmp), rate=args.latency_rate, events=live)
    per_conv, text = memory_per_conversation(args.open_conversations)
    print(
        f"(2) memory: {per_conv:,.0f} bytes per open conversation beyond its text "
        f"({args.open_conversations:,} open, 4 messages each, {text:,.0f} bytes of text each) (target <= 2048)"
    )
    print(
        f"(3) latency, record fetched -> hook called, at {args.latency_rate:,.0f} events/s: "
        f"p50 {p50 * 1e3:.2f} ms, p99 {p99 * 1e3:.2f} ms"
    )


if __name__ == "__main__":
    asyncio.run(main())
