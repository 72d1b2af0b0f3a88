"""The one dataset reader: its schema, its limits policy and what it does with hostile input."""

from __future__ import annotations

import gzip
import json
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.errors import ConfigError
from sidecar.transcript.dataset import (
    MAX_LINE_BYTES,
    MAX_MESSAGES,
    DatasetError,
    InvalidRecord,
    ReadLimits,
    ReadStats,
    parse_line,
    read_conversations,
    read_objects,
    record_json,
    without_artefacts,
)
from sidecar.transcript.model import Message, ToolCall

GOOD: dict[str, Any] = {
    "conversation_id": "star/1",
    "source": "star",
    "domain": "bank",
    "turns": [
        {"role": "system", "content": "You are a bank."},
        {"role": "user", "content": "What is my balance?"},
        {"role": "assistant", "content": "", "tool_calls": [{"name": "balance", "arguments": '{"id": 3}'}]},
        {"role": "tool", "content": '{"balance": 10}', "name": "balance"},
        {"role": "assistant", "content": "You have 10 dollars."},
    ],
    "meta": {"completed": True, "tasks": ["a", "b"]},
}


def line(rec: Any) -> bytes:
    return json.dumps(rec).encode()


def write(path: Path, lines: list[bytes]) -> Path:
    data = b"".join(x + b"\n" for x in lines)
    path.write_bytes(gzip.compress(data) if path.name.endswith(".gz") else data)
    return path


def read(path: Path, limits: ReadLimits | None = None, strict: bool = False) -> tuple[list[Any], ReadStats]:
    stats = ReadStats()
    return list(read_conversations(path, stats=stats, limits=limits, strict=strict)), stats


@pytest.mark.parametrize("name", ["d.jsonl", "d.jsonl.gz"])
def test_a_valid_record_round_trips(tmp_path: Path, name: str) -> None:
    [rec], stats = read(write(tmp_path / name, [line(GOOD)]))
    assert rec.conversation_id == "star/1" and rec.line == 1
    assert rec.messages[2] == Message("assistant", "", None, (ToolCall("balance", '{"id": 3}'),))
    assert rec.messages[3].name == "balance"
    assert (rec.source, rec.domain, rec.meta["completed"], rec.lookup("meta.tasks.1")) == ("star", "bank", True, "b")
    assert rec.lookup("meta.tasks.7") is None and rec.lookup("nope.x") is None
    assert record_json(rec) == GOOD
    assert (stats.files, stats.lines, stats.records, stats.skipped) == (1, 1, 1, {})


def test_messages_is_read_when_turns_is_absent_and_arguments_become_json_text(tmp_path: Path) -> None:
    rec = {"conversation_id": "x", "messages": [
        {"role": "assistant", "tool_calls": [{"name": "f", "arguments": {"b": 1, "a": [2]}}, {"name": "g"}],
         "name": 5},
    ]}  # fmt: skip
    [got], _ = read(write(tmp_path / "d.jsonl", [line(rec)]))
    assert got.messages == (Message("assistant", "", None, (ToolCall("f", '{"a": [2], "b": 1}'), ToolCall("g", ""))),)


MALFORMED: list[tuple[bytes, str]] = [
    (b"{not json", "invalid_json"),
    (b"\xff\xfe{}", "invalid_utf8"),
    ('{"conversation_id": "\udcff"}'.encode("utf-8", "surrogatepass"), "invalid_utf8"),
    (b"[1, 2]", "not_an_object"),
    (b"null", "not_an_object"),
    (b'"a string"', "not_an_object"),
    (b"[" * 200_000, "invalid_json"),  # deep nesting: a RecursionError inside json is caught
    (b'{"a":' * 50_000 + b"1" + b"}" * 50_000, "invalid_json"),
    (line({"turns": []}), "bad_conversation_id"),
    (line({"conversation_id": "", "turns": []}), "bad_conversation_id"),
    (line({"conversation_id": 5, "turns": []}), "bad_conversation_id"),
    (line({"conversation_id": "x" * 513, "turns": []}), "bad_conversation_id"),
    (line({"conversation_id": "a"}), "bad_messages"),
    (line({"conversation_id": "a", "turns": None, "messages": []}), "bad_messages"),
    (line({"conversation_id": "a", "turns": "nope"}), "bad_messages"),
    (line({"conversation_id": "a", "turns": {"role": "user"}}), "bad_messages"),
    (line({"conversation_id": "a", "turns": [{"role": "user", "content": "x"}] * (MAX_MESSAGES + 1)}), "bad_messages"),
    (line({"conversation_id": "a", "turns": ["hi"]}), "bad_message"),
    (line({"conversation_id": "a", "turns": [{"role": "wizard", "content": "x"}]}), "bad_message"),
    (line({"conversation_id": "a", "turns": [{"content": "x"}]}), "bad_message"),
    (line({"conversation_id": "a", "turns": [{"role": "user", "content": 3}]}), "bad_message"),
    (line({"conversation_id": "a", "turns": [{"role": "user", "content": None}]}), "bad_message"),
    (line({"conversation_id": "a", "turns": [{"role": "assistant", "content": "", "tool_calls": "x"}]}), "bad_message"),
    (
        line({"conversation_id": "a", "turns": [{"role": "assistant", "tool_calls": [{"arguments": "{}"}]}]}),
        "bad_message",
    ),
    (line({"conversation_id": "a", "turns": [{"role": "assistant", "tool_calls": [["f"]]}]}), "bad_message"),
]


@pytest.mark.parametrize(("raw", "reason"), MALFORMED)
def test_malformed_lines_are_skipped_with_their_reason_and_line(tmp_path: Path, raw: bytes, reason: str) -> None:
    path = write(tmp_path / "d.jsonl", [line(GOOD), raw, b"", b"   ", line({**GOOD, "conversation_id": "b"})])
    got, stats = read(path)
    assert [r.conversation_id for r in got] == ["star/1", "b"] and [r.line for r in got] == [1, 5]
    assert stats.skipped == {reason: 1} and stats.problems == [f"line 2: {reason.replace('_', ' ')}"]
    assert stats.records == 2 and stats.lines == 5 and stats.malformed == 1
    with pytest.raises(DatasetError, match=f"line 2: {reason.replace('_', ' ')}") as exc:
        read(path, strict=True)
    assert (exc.value.reason, exc.value.line) == (reason, 2)
    assert isinstance(exc.value, ConfigError)  # the tools' command lines report it as a usage error


def test_an_oversized_line_is_drained_without_being_held(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    with path.open("wb") as fh:
        fh.write(b'{"conversation_id": "big", "x": "' + b"a" * (3 * MAX_LINE_BYTES) + b'"}\n')
        fh.write(line(GOOD) + b"\n")
        fh.write(b'"' + b"z" * (MAX_LINE_BYTES + 10))  # the last line, no newline
    tracemalloc.start()
    try:
        got, stats = read(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert [r.conversation_id for r in got] == ["star/1"]
    assert stats.skipped == {"oversized_line": 2} and stats.lines == 3
    assert peak < 3 * MAX_LINE_BYTES  # one line's worth (and its copies), never the 24 MiB line
    with pytest.raises(DatasetError, match="line 1: oversized line"):
        read(path, strict=True)


def test_the_line_limit_counts_the_newline(tmp_path: Path) -> None:
    head = b'{"conversation_id": "a", "turns": [], "pad": "'
    fits = head + b"p" * (1000 - len(head) - 3) + b'"}'  # 999 bytes, 1000 with its newline
    [rec], _ = read(write(tmp_path / "d.jsonl", [fits]), ReadLimits(max_line_bytes=1000))
    assert rec.conversation_id == "a"
    got, stats = read(write(tmp_path / "e.jsonl", [fits[:-2] + b'p"}']), ReadLimits(max_line_bytes=1000))
    assert got == [] and stats.skipped == {"oversized_line": 1}


def test_a_gzip_bomb_stops_at_the_total_cap(tmp_path: Path) -> None:
    bomb = tmp_path / "bomb.jsonl.gz"
    bomb.write_bytes(gzip.compress(b" " * 200_000_000 + b"\n"))  # ~200 KB on disk, 200 MB inflated
    assert bomb.stat().st_size < 400_000
    limits = ReadLimits(max_total_bytes=10_000_000, flag="--max-input-bytes")
    tracemalloc.start()
    try:
        with pytest.raises(DatasetError, match=r"more than 10000000 bytes of data .*\(--max-input-bytes\)") as exc:
            read(bomb, limits)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert exc.value.reason == "too_large"
    assert peak < 3 * MAX_LINE_BYTES
    lines = tmp_path / "lines.jsonl.gz"
    lines.write_bytes(gzip.compress(b"\n" * 2_000_000))  # blank lines count too
    with pytest.raises(DatasetError, match="more than 1000000 bytes"):
        read(lines, ReadLimits(max_total_bytes=1_000_000))


def test_the_cap_spans_everything_one_stats_reads_and_the_size_on_disk_is_checked_first(tmp_path: Path) -> None:
    path = write(tmp_path / "d.jsonl", [line(GOOD)] * 10)
    size = path.stat().st_size
    stats = ReadStats()
    limits = ReadLimits(max_total_bytes=int(size * 1.5))
    assert len(list(read_conversations(path, stats=stats, limits=limits))) == 10
    with pytest.raises(DatasetError, match=f"is {size} bytes; the limit is {int(size * 1.5) - size}"):
        list(read_conversations(path, stats=stats, limits=limits))


def test_max_records_stops_reading(tmp_path: Path) -> None:
    path = write(tmp_path / "d.jsonl", [line({**GOOD, "conversation_id": f"c{i}"}) for i in range(10)])
    got, stats = read(path, ReadLimits(max_records=3))
    assert [r.conversation_id for r in got] == ["c0", "c1", "c2"] and stats.capped
    got, stats = read(path, ReadLimits(max_records=10))
    assert len(got) == 10 and not stats.capped


def test_records_a_caller_drops_do_not_count_towards_the_cap(tmp_path: Path) -> None:
    path = write(tmp_path / "d.jsonl", [line({"conversation_id": f"c{i}", "turns": []}) for i in range(6)])
    stats = ReadStats()
    kept = []
    for rec in read_conversations(path, stats=stats, limits=ReadLimits(max_records=2)):
        if rec.conversation_id in ("c0", "c2"):
            stats.drop(rec.line, "not_wanted")
        else:
            kept.append(rec.conversation_id)
    assert kept == ["c1", "c3"] and stats.records == 2 and stats.skipped == {"not_wanted": 2}


@pytest.mark.parametrize("content", [b"", b"\n\n   \n"])
def test_empty_files_give_nothing(tmp_path: Path, content: bytes) -> None:
    for name in ("d.jsonl", "d.jsonl.gz"):
        path = tmp_path / name
        path.write_bytes(gzip.compress(content) if name.endswith(".gz") else content)
        got, stats = read(path)
        assert got == [] and stats.skipped == {} and stats.files == 1


def test_bad_files_are_errors(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="does not exist"):
        read(tmp_path / "missing.jsonl")
    with pytest.raises(DatasetError, match="not a regular file"):
        read(tmp_path)
    fake = tmp_path / "fake.jsonl.gz"
    fake.write_bytes(b"this is not gzip\n")
    with pytest.raises(DatasetError, match="not a readable gzip/JSONL file"):
        read(fake)
    whole = gzip.compress(line(GOOD) * 100 + b"\n")
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(DatasetError, match="not a readable gzip/JSONL file"):
        read(cut)


def test_objects_are_read_whatever_their_fields(tmp_path: Path) -> None:
    path = write(tmp_path / "g.jsonl", [b'{"goal": "x"}', b"[1]", b"{}"])
    stats = ReadStats()
    assert list(read_objects(path, stats=stats)) == [(1, {"goal": "x"}), (3, {})]
    assert stats.skipped == {"not_an_object": 1}


def test_artefacts_are_stripped_and_emptied_messages_dropped() -> None:
    msgs = (
        Message("user", "thanks ###STOP###"),
        Message("user", "###STOP###"),
        Message("assistant", "###STOP###", tool_calls=(ToolCall("f"),)),
        Message("user", "fine"),
    )
    assert without_artefacts(msgs) == (Message("user", "thanks"), Message("assistant", "", tool_calls=(ToolCall("f"),)),
                                       Message("user", "fine"))  # fmt: skip


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=2000))
def test_parse_line_raises_only_invalid_record_on_any_bytes(data: bytes) -> None:
    try:
        rec = parse_line(data)
    except InvalidRecord as bad:
        assert bad.reason
    else:
        assert rec.conversation_id and all(isinstance(m, Message) for m in rec.messages)


@settings(max_examples=300, deadline=None)
@given(json_values, json_values, json_values)
def test_parse_line_raises_only_invalid_record_on_any_json(cid: object, turns: object, meta: object) -> None:
    try:
        rec = parse_line(line({"conversation_id": cid, "turns": turns, "meta": meta}))
    except InvalidRecord as bad:
        assert bad.reason in ("bad_conversation_id", "bad_messages", "bad_message")
    else:
        assert isinstance(cid, str) and isinstance(turns, list)
        assert all(
            isinstance(m.content, str) and all(isinstance(c.arguments, str) for c in m.tool_calls) for m in rec.messages
        )
        assert rec.meta == (meta if isinstance(meta, dict) else {})
