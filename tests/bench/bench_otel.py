"""OTLP ingest throughput: spans/s decoding alone against decoding + normalising + diffing.

Builds Collector-style records (a batch of traces per record, each trace an ``invoke_agent`` span
and one chat span whose history repeats the conversation so far) in both encodings, then times, in
the same run and on the same records: (1) ``decode_traces`` only, (2) ``decode_traces`` plus
``OtelIngest.derive`` (dialects, conversation lookup, history diffing, event encoding and the
sidecar's own check of every event). Kafka is not involved: that cost is the producer's.

Run: ``.venv/bin/python -m tests.bench.bench_otel [--conversations 200] [--turns 8] [--rounds 3]``
"""

from __future__ import annotations

import argparse
import random
import time

from prometheus_client import CollectorRegistry

from sidecar.otel.config import OtelConfig
from sidecar.otel.decode import Encoding, decode_traces
from sidecar.otel.ingest import OtelIngest
from sidecar.otel.metrics import OtelMetrics
from tests.otel.spans import chat_attrs, conversation, encode, make_span, model_calls, new_id, traces


def build(conversations: int, turns: int, encoding: Encoding, per_record: int = 20) -> tuple[list[bytes], int]:
    spans = []
    for c in range(conversations):
        cid = f"bench-{c}"
        for j, call in enumerate(model_calls(conversation(turns, tag=str(c)))):
            trace = new_id(16)
            root = make_span(
                {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "desk", "gen_ai.conversation.id": cid},
                trace_id=trace,
                start=j * 10,
            )
            chat = make_span(
                chat_attrs(("genai", "openinference")[c % 2], call, None),
                trace_id=trace,
                parent=root.span_id,
                start=j * 10 + 1,
            )
            spans.append((j, [root, chat]))
    spans.sort(key=lambda s: s[0])  # turn by turn, as live traffic arrives
    records = [
        encode(traces(s for _, pair in spans[i : i + per_record] for s in pair), encoding)
        for i in range(0, len(spans), per_record)
    ]
    return records, 2 * len(spans)


def run(records: list[bytes], encoding: Encoding, normalise: bool) -> float:
    ingest = OtelIngest(OtelConfig(), OtelMetrics(CollectorRegistry()), max_event_bytes=1 << 20)
    start = time.perf_counter()
    for payload in records:
        data = decode_traces(payload, encoding, max_bytes=1 << 26)
        if normalise:
            ingest.derive(data, "bench")
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--conversations", type=int, default=200)
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    random.seed(0)
    encodings: tuple[Encoding, ...] = ("otlp_proto", "otlp_json")
    for encoding in encodings:
        records, spans = build(args.conversations, args.turns, encoding)
        size = sum(map(len, records))
        decode = min(run(records, encoding, normalise=False) for _ in range(args.rounds))
        full = min(run(records, encoding, normalise=True) for _ in range(args.rounds))
        print(f"{encoding}: {spans} spans in {len(records)} records ({size / 1e6:.1f} MB)")
        print(f"  decode only:             {spans / decode:10,.0f} spans/s")
        print(f"  decode + normalise+diff: {spans / full:10,.0f} spans/s  ({full / decode:.1f}x decode)")


if __name__ == "__main__":
    main()
