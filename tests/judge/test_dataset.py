"""Reading judge examples: bad lines skipped and counted, artefacts stripped, labels, the truncation
protocol."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from sidecar.errors import ConfigError
from sidecar.tools.judge.dataset import (
    ReadStats,
    as_label,
    check_input,
    read_examples,
    truncation_turn,
)
from sidecar.transcript.dataset import MAX_LINE_BYTES
from sidecar.transcript.model import count_turns


def conv(cid: str, turns: int, **meta: Any) -> dict[str, Any]:
    msgs: list[dict[str, Any]] = []
    for i in range(turns):
        msgs += [{"role": "user", "content": f"u{i}"}, {"role": "assistant", "content": f"a{i}"}]
    return {"conversation_id": cid, "source": "test", "turns": msgs, "meta": meta}


def write(path: Path, lines: list[bytes]) -> Path:
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


def test_bad_lines_are_skipped_and_counted(tmp_path: Path) -> None:
    lines = [
        json.dumps(conv("ok", 2)).encode(),
        b"{not json",
        b"\xff\xfe",
        b"[1, 2]",
        json.dumps({"conversation_id": "x", "turns": [{"role": "robot", "content": "hi"}]}).encode(),
        json.dumps({"conversation_id": "y", "turns": [{"role": "assistant", "content": "hello"}]}).encode(),
        json.dumps({"conversation_id": "z", "turns": "nope"}).encode(),
        b"x" * (MAX_LINE_BYTES + 10),
        b"",
        json.dumps(conv("ok2", 1)).encode(),
    ]
    stats = ReadStats()
    got = list(read_examples(write(tmp_path / "c.jsonl", lines), stats=stats))
    assert [e.conversation_id for e in got] == ["ok", "ok2"]
    assert stats.records == 2
    assert stats.skipped == {"invalid_json": 1, "invalid_utf8": 1, "not_an_object": 1, "bad_message": 1,
                             "no_user_message": 1, "bad_messages": 1, "oversized_line": 1}  # fmt: skip


def test_gzip_and_the_stop_artefact(tmp_path: Path) -> None:
    rec = {"conversation_id": "t", "turns": [
        {"role": "user", "content": "change my flight"}, {"role": "assistant", "content": "done"},
        {"role": "user", "content": "thanks ###STOP###"}, {"role": "user", "content": "###STOP###"},
    ]}  # fmt: skip
    path = tmp_path / "c.jsonl.gz"
    with gzip.open(path, "wb") as fh:
        fh.write(json.dumps(rec).encode() + b"\n")
    (ex,) = read_examples(path, stats=ReadStats())
    assert [m.content for m in ex.messages] == ["change my flight", "done", "thanks"]


def test_labels_from_a_field() -> None:
    assert [as_label(v) for v in (True, False, 1, 0, 1.0, "true", "No", "1")] == [True, False, True, False, True,
                                                                                  True, False, True]  # fmt: skip
    assert [as_label(v) for v in (None, 0.5, "maybe", [1], 2)] == [None] * 5


def test_label_field(tmp_path: Path) -> None:
    path = write(tmp_path / "c.jsonl", [json.dumps(conv("a", 2, success=True)).encode(),
                                        json.dumps(conv("b", 2, reward=0.0)).encode()])  # fmt: skip
    got = list(read_examples(path, stats=ReadStats(), label_field="meta.success"))
    assert [e.label for e in got] == [True, None]


def test_truncation_protocol_is_seeded_and_excludes_dataset_marked_failures(tmp_path: Path) -> None:
    path = write(tmp_path / "c.jsonl", [json.dumps(conv("a", 5)).encode(), json.dumps(conv("one", 1)).encode(),
                                        json.dumps(conv("star", 4, completed=False)).encode()])  # fmt: skip
    stats = ReadStats()
    got = list(read_examples(path, stats=stats, protocol="truncation", seed=3))
    assert [(e.conversation_id, e.kind, e.label) for e in got] == [("a", "full", True), ("a", "truncated", False),
                                                                   ("one", "full", True)]  # fmt: skip
    k = truncation_turn("a", 5, 3)
    assert k is not None and 1 <= k <= 4 and count_turns(got[1].messages) == k
    assert got[1].messages == got[0].messages[: 2 * k]
    assert truncation_turn("a", 5, 3) == k and truncation_turn("one", 1, 3) is None
    assert stats.skipped == {"marked_not_completed": 1}


def test_check_input(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        check_input(tmp_path / "missing.jsonl", 100)
    with pytest.raises(ConfigError, match="not a regular file"):
        check_input(tmp_path, 100)
    big = write(tmp_path / "big.jsonl", [b"x" * 200])
    with pytest.raises(ConfigError, match="the limit is 100"):
        check_input(big, 100)
