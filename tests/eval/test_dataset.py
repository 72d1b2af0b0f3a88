"""Reading the evaluation input: malformed lines, empty, oversized and compressed-bomb files."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from sidecar.errors import ConfigError
from sidecar.tools.eval.dataset import read_dataset
from sidecar.transcript.dataset import MAX_LINE_BYTES

GOOD = {
    "conversation_id": "star/1",
    "source": "star",
    "domain": "bank",
    "turns": [
        {"role": "user", "content": "What is my balance?"},
        {"role": "assistant", "content": "", "tool_calls": [{"name": "balance", "arguments": {"id": 3}}]},
        {"role": "tool", "content": '{"balance": 10}', "name": "balance"},
        {"role": "assistant", "content": "You have 10 dollars."},
    ],
    "meta": {
        "completed": True,
        "completion_level": "Complete",
        "user_reported_task_success": None,
        "reward": 1.0,
        "secret": "not a label",
        "user_guide_instructions": ["hidden goal"],
    },
}
LIMIT = 64 * 1024 * 1024


def write(path: Path, lines: list[str | bytes]) -> Path:
    data = b"".join((x if isinstance(x, bytes) else x.encode()) + b"\n" for x in lines)
    if path.suffix == ".gz":
        path.write_bytes(gzip.compress(data))
    else:
        path.write_bytes(data)
    return path


def test_valid_record_keeps_messages_and_only_outcome_labels(tmp_path: Path) -> None:
    convs, report = read_dataset(write(tmp_path / "d.jsonl.gz", [json.dumps(GOOD)]), max_bytes=LIMIT)
    [c] = convs
    assert report.read == 1 and not report.skipped
    assert c.turns == 1 and len(c.messages) == 4 and c.source == "star"
    assert c.messages[1].tool_calls[0].arguments == '{"id": 3}'
    assert dict(c.labels) == {"completed": True, "completion_level": "Complete", "reward": 1.0}


def test_malformed_lines_are_skipped_counted_and_located(tmp_path: Path) -> None:
    lines: list[str | bytes] = [
        json.dumps(GOOD),
        "{not json",
        b'{"conversation_id": "u", "turns": [{"role": "user", "content": "\xff"}]}',
        "[1, 2]",
        json.dumps({"conversation_id": 5, "turns": []}),
        json.dumps({"conversation_id": "x", "turns": [{"role": "wizard", "content": "hi"}]}),
        json.dumps({"conversation_id": "y", "turns": "nope"}),
        json.dumps({"conversation_id": "z", "turns": [{"role": "assistant", "content": "hello?"}]}),
        json.dumps(GOOD),  # duplicate id
        "",
        json.dumps(
            {**GOOD, "conversation_id": "big", "turns": [{"role": "user", "content": "a" * (MAX_LINE_BYTES + 5)}]}
        ),
        json.dumps({**GOOD, "conversation_id": "star/2"}),
        "[" * 100_000,
    ]
    convs, report = read_dataset(write(tmp_path / "d.jsonl", lines), max_bytes=LIMIT)
    assert [c.conversation_id for c in convs] == ["star/1", "star/2"]
    assert report.skipped == {
        "invalid_json": 2,
        "invalid_utf8": 1,
        "not_an_object": 1,
        "bad_conversation_id": 1,
        "bad_message": 1,
        "bad_messages": 1,
        "no_user_message": 1,
        "duplicate_id": 1,
        "oversized_line": 1,
    }
    assert report.problems[:2] == ["line 2: invalid json", "line 3: invalid utf8"]
    assert "10 lines skipped" in report.describe()
    with pytest.raises(ConfigError, match=r"line 2: invalid json \(without --strict"):
        read_dataset(tmp_path / "d.jsonl", max_bytes=LIMIT, strict=True)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "is empty"),
        (b"\n\n  \n", "no valid conversation"),
        (b"{bad\n[]\n", r"no valid conversation \(line 1: invalid json; line 2: not an object\)"),
    ],
)
def test_files_without_conversations_are_errors(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "d.jsonl"
    path.write_bytes(content)
    with pytest.raises(ConfigError, match=message):
        read_dataset(path, max_bytes=LIMIT)


def test_missing_directory_oversized_and_corrupt_inputs(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        read_dataset(tmp_path / "nope.jsonl", max_bytes=LIMIT)
    with pytest.raises(ConfigError, match="not a regular file"):
        read_dataset(tmp_path, max_bytes=LIMIT)
    big = write(tmp_path / "big.jsonl", [json.dumps(GOOD)] * 100)
    with pytest.raises(ConfigError, match=r"bytes; the limit is 1000 \(--max-input-bytes\)"):
        read_dataset(big, max_bytes=1000)
    bomb = tmp_path / "bomb.jsonl.gz"
    bomb.write_bytes(gzip.compress(b"\n" * 5_000_000))  # ~5 KB on disk, 5 MB of data
    assert bomb.stat().st_size < 100_000
    with pytest.raises(ConfigError, match="more than 100000 bytes of data"):
        read_dataset(bomb, max_bytes=100_000)
    fake = tmp_path / "fake.jsonl.gz"
    fake.write_bytes(b"this is not gzip\n")
    with pytest.raises(ConfigError, match="not a readable gzip/JSONL file"):
        read_dataset(fake, max_bytes=LIMIT)
