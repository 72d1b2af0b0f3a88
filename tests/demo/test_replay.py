"""Replay: dataset records -> contract-v1 events, interleaving, loading, producing to Kafka."""

from __future__ import annotations

import asyncio
import gzip
import importlib
import itertools
import json
import time
import uuid
from collections import defaultdict
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.tools.demo.mock_cluster import MockKafkaCluster
from sidecar.tools.demo.replay import (
    SampleError,
    agent_tag,
    conversation_events,
    encode,
    event_id,
    interleave,
    load_jsonl_gz,
    load_sample,
    produce,
)
from sidecar.transcript.dataset import MAX_LINE_BYTES
from tests.demo.conftest import consume_all

# Imported by name: jsonschema ships no type stubs here, and this keeps mypy strict either way.
jsonschema: Any = importlib.import_module("jsonschema")

SCHEMA = json.loads(resources.files("sidecar").joinpath("schemas/event-v1.schema.json").read_text("utf-8"))

RECORD: dict[str, Any] = {
    "conversation_id": "star/42",
    "source": "star",
    "domain": "bank",
    "turns": [
        {"role": "user", "content": "I lost my card"},
        {"role": "assistant", "content": "", "tool_calls": [{"name": "bank_lookup", "arguments": "{}"}]},
        {"role": "tool", "content": '{"ok": true}', "name": "bank_lookup"},
        {"role": "assistant", "content": "Blocked it. Anything else?"},
    ],
    "meta": {"completed": True},
}


def test_events_follow_contract_v1() -> None:
    events = conversation_events(RECORD, start_ts=1_700_000_000.0)
    validator = jsonschema.Draft202012Validator(SCHEMA)
    for ev in events:
        validator.validate(ev)
    assert [e["seq"] for e in events] == [0, 1, 2, 3, 4]
    assert [e["type"] for e in events] == ["message"] * 4 + ["conversation_end"]
    assert "message" not in events[-1]
    assert events[0]["message"] == {"role": "user", "content": "I lost my card"}
    assert events[1]["message"]["tool_calls"] == [{"name": "bank_lookup", "arguments": "{}"}]
    assert events[2]["message"]["name"] == "bank_lookup"
    assert {e["agent"] for e in events} == {"star"}
    assert {e["tenant"] for e in events} == {"demo"}
    assert [e["ts"] for e in events] == [1_700_000_000.0 + i for i in range(5)]


def test_event_ids_are_deterministic_uuid5_and_unique() -> None:
    a = conversation_events(RECORD)
    b = conversation_events(RECORD)
    assert [e["event_id"] for e in a] == [e["event_id"] for e in b]
    assert len({e["event_id"] for e in a}) == len(a)
    assert uuid.UUID(a[0]["event_id"]).version == 5
    assert a[3]["event_id"] == event_id("star/42", 3)
    renamed = conversation_events(RECORD, conversation_id="star/42#r1")
    assert {e["conversation_id"] for e in renamed} == {"star/42#r1"}
    assert not {e["event_id"] for e in renamed} & {e["event_id"] for e in a}


def test_options_agent_tenant_no_end() -> None:
    events = conversation_events(RECORD, agent="support-bot", tenant=None, end=False)
    assert len(events) == 4
    assert {e["agent"] for e in events} == {"support-bot"}
    assert {e["tenant"] for e in events} == {None}
    [only_end] = conversation_events({**RECORD, "turns": []})
    assert (only_end["type"], only_end["seq"]) == ("conversation_end", 0)


@pytest.mark.parametrize(
    ("source", "tag"),
    [
        ("multiwoz21_convlab2", "multiwoz21_convlab2"),
        ("tau bench/airline", "tau_bench_airline"),
        ("", "unknown"),
        ("x" * 100, "x" * 64),
        ("émoji🙂", "_moji_"),
    ],
)
def test_agent_tag_is_always_valid(source: str, tag: str) -> None:
    assert agent_tag(source) == tag
    jsonschema.validate({"agent": agent_tag(source)}, {"properties": SCHEMA["properties"]})


def test_whole_bundled_sample_is_valid_and_clean() -> None:
    sample = load_sample()
    assert len(sample) == 300
    assert {r["source"] for r in sample} == {"star", "multiwoz21_convlab2", "taubench_airline"}
    validator = jsonschema.Draft202012Validator(SCHEMA)
    ids = set()
    for rec in sample:
        for ev in conversation_events(rec):
            validator.validate(ev)
            assert "###STOP###" not in ev.get("message", {}).get("content", "")
            ids.add(ev["event_id"])
    assert len(ids) == sum(len(r["turns"]) + 1 for r in sample)


def _streams(sizes: list[int]) -> list[list[dict[str, Any]]]:
    return [[{"conversation_id": f"c{i}", "seq": s} for s in range(n)] for i, n in enumerate(sizes)]


@settings(max_examples=200, deadline=None)
@given(sizes=st.lists(st.integers(0, 12), max_size=30), concurrency=st.integers(1, 8), seed=st.integers(0, 2**32))
def test_interleave_invariants(sizes: list[int], concurrency: int, seed: int) -> None:
    convs = _streams(sizes)
    out = list(interleave(convs, concurrency=concurrency, seed=seed))
    # Every event exactly once.
    assert sorted((e["conversation_id"], e["seq"]) for e in out) == sorted(
        (e["conversation_id"], e["seq"]) for c in convs for e in c
    )
    # Each conversation's order kept.
    per: dict[str, list[int]] = defaultdict(list)
    for e in out:
        per[e["conversation_id"]].append(e["seq"])
    assert all(seqs == sorted(seqs) for seqs in per.values())
    # Never more than `concurrency` conversations started and not yet finished.
    remaining = {f"c{i}": n for i, n in enumerate(sizes)}
    open_now: set[str] = set()
    for e in out:
        open_now.add(e["conversation_id"])
        remaining[e["conversation_id"]] -= 1
        assert len(open_now) <= concurrency
        if remaining[e["conversation_id"]] == 0:
            open_now.discard(e["conversation_id"])
    # Same seed, same stream.
    assert out == list(interleave(_streams(sizes), concurrency=concurrency, seed=seed))


def test_interleave_actually_interleaves_and_opens_the_first_ones_first() -> None:
    out = list(interleave(_streams([20] * 10), concurrency=4, seed=1))
    first_seen = list(dict.fromkeys(e["conversation_id"] for e in out))
    assert set(first_seen[:4]) == {"c0", "c1", "c2", "c3"}
    assert len(first_seen) == 10
    switches = sum(1 for a, b in itertools.pairwise(out) if a["conversation_id"] != b["conversation_id"])
    assert switches > 50
    assert out != list(interleave(_streams([20] * 10), concurrency=4, seed=2))


def test_interleave_is_lazy_on_infinite_input() -> None:
    endless = (conversation_events(RECORD, conversation_id=f"c{i}") for i in itertools.count())
    head = list(itertools.islice(interleave(endless, concurrency=3, seed=0), 1000))
    assert len(head) == 1000


@pytest.mark.parametrize("concurrency", [0, -1])
def test_interleave_rejects_bad_concurrency(concurrency: int) -> None:
    with pytest.raises(ValueError, match="concurrency"):
        next(interleave(_streams([1]), concurrency=concurrency, seed=0))


def _write_gz(path: Path, data: bytes) -> Path:
    with gzip.open(path, "wb") as fh:
        fh.write(data)
    return path


def test_load_jsonl_gz_reads_records_and_skips_blank_lines(tmp_path: Path) -> None:
    line = json.dumps(RECORD).encode()
    path = _write_gz(tmp_path / "ok.jsonl.gz", line + b"\n\n" + line + b"\n")
    assert load_jsonl_gz(path) == [RECORD, RECORD]


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        (b"{not json}\n", "line 1: invalid json"),
        (b"\xff\xfe{}\n", "line 1: invalid utf8"),
        (b"[1, 2]\n", "line 1: not an object"),
        (b'{"turns": []}\n', "bad conversation id"),
        (b'{"conversation_id": "", "turns": []}\n', "bad conversation id"),
        (('{"conversation_id": "' + "c" * 300 + '", "turns": []}\n').encode(), "longer than 256"),
        (b'{"conversation_id": "a", "turns": {}}\n', "bad messages"),
        (b'{"conversation_id": "a", "turns": [{"role": "robot", "content": "x"}]}\n', "bad message"),
        (b'{"conversation_id": "a", "turns": [{"role": "user", "content": 5}]}\n', "bad message"),
        (b'{"conversation_id": "a", "turns": [{"role": "user", "content": "", "tool_calls": [{}]}]}\n', "bad message"),
        (json.dumps(RECORD).encode() + b"\n" + b"null\n", "line 2"),
    ],
)
def test_load_jsonl_gz_rejects_malformed_records(tmp_path: Path, payload: bytes, message: str) -> None:
    with pytest.raises(SampleError, match=message):
        load_jsonl_gz(_write_gz(tmp_path / "bad.jsonl.gz", payload))


def test_load_jsonl_gz_rejects_bad_files(tmp_path: Path) -> None:
    with pytest.raises(SampleError, match="does not exist"):
        load_jsonl_gz(tmp_path / "missing.jsonl.gz")
    with pytest.raises(SampleError, match="not a regular file"):
        load_jsonl_gz(tmp_path)
    plain = tmp_path / "plain.jsonl.gz"
    plain.write_bytes(json.dumps(RECORD).encode())
    with pytest.raises(SampleError, match="not a readable gzip"):
        load_jsonl_gz(plain)
    truncated = tmp_path / "truncated.jsonl.gz"
    full = _write_gz(tmp_path / "full.jsonl.gz", (json.dumps(RECORD) + "\n").encode() * 200).read_bytes()
    truncated.write_bytes(full[: len(full) // 2])
    with pytest.raises(SampleError, match="not a readable gzip"):
        load_jsonl_gz(truncated)


def test_load_jsonl_gz_rejects_oversized_line(tmp_path: Path) -> None:
    huge = json.dumps({**RECORD, "turns": [{"role": "user", "content": "a" * (MAX_LINE_BYTES + 1)}]}).encode()
    with pytest.raises(SampleError, match="line 1: oversized line"):
        load_jsonl_gz(_write_gz(tmp_path / "huge.jsonl.gz", huge + b"\n"))


def test_encode_key_and_compact_utf8_value() -> None:
    ev = conversation_events({**RECORD, "conversation_id": "ü/1", "turns": [{"role": "user", "content": "naïve ☕"}]})[
        0
    ]
    key, value = encode(ev)
    assert key == "ü/1".encode()
    assert b" " not in value.replace("naïve ☕".encode(), b"")
    assert "naïve ☕".encode() in value
    assert json.loads(value) == ev


async def test_produce_delivers_every_event_keyed_and_in_order(kafka: MockKafkaCluster) -> None:
    sample = load_sample()[:12]
    events = list(interleave((conversation_events(r) for r in sample), concurrency=4, seed=3))
    seen: list[int] = []
    n = await produce(kafka.bootstrap_servers, "replay-order", events, rate=None, progress=seen.append)
    assert n == len(events)
    assert seen == list(range(1, n + 1))
    records = await consume_all(kafka.bootstrap_servers, "replay-order", n)
    assert len(records) == n
    per: dict[str, list[int]] = defaultdict(list)
    for key, value in records:
        assert key == value["conversation_id"].encode()
        per[value["conversation_id"]].append(value["seq"])
    expected = {r["conversation_id"]: list(range(len(r["turns"]) + 1)) for r in sample}
    assert dict(per) == expected


async def test_produce_paces_to_the_rate_and_stamps_time(kafka: MockKafkaCluster) -> None:
    events = list(
        itertools.chain.from_iterable(conversation_events(RECORD, conversation_id=f"p{i}") for i in range(12))
    )
    before = time.time()
    t0 = time.monotonic()
    n = await produce(kafka.bootstrap_servers, "replay-paced", events, rate=200.0, stamp_now=True)
    elapsed = time.monotonic() - t0
    assert n == 60
    # 60 events at 200/s cannot go out in less than 59/200 s: the pacer sleeps between them.
    assert elapsed >= 59 / 200 - 0.01
    records = await consume_all(kafka.bootstrap_servers, "replay-paced", 60)
    assert all(before <= v["ts"] <= time.time() for _, v in records)


async def test_produce_stops_early_on_stop_event(kafka: MockKafkaCluster) -> None:
    stop = asyncio.Event()
    endless = (conversation_events(RECORD, conversation_id=f"s{i}") for i in itertools.count())

    def progress(n: int) -> None:
        if n == 25:
            stop.set()

    n = await produce(
        kafka.bootstrap_servers,
        "replay-stop",
        itertools.chain.from_iterable(endless),
        rate=None,
        progress=progress,
        stop=stop,
    )
    assert n == 25


@pytest.mark.parametrize("rate", [0.0, -5.0, float("nan"), float("inf")])
async def test_produce_rejects_bad_rate(rate: float) -> None:
    with pytest.raises(ValueError, match="rate"):
        await produce("127.0.0.1:1", "t", [], rate=rate)
