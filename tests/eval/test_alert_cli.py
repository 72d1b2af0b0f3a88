"""``sidecar eval-alerts``: bad usage and bad input are clear errors (exit 2), before any model call."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sidecar.cli import main

CONV = {"conversation_id": "c1", "turns": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}


def data(tmp_path: Path) -> Path:
    path = tmp_path / "in.jsonl"
    path.write_text(json.dumps(CONV) + "\n")
    return path


def test_a_missing_or_empty_input_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["eval-alerts", str(tmp_path / "nope.jsonl"), "--out", str(tmp_path / "o")]) == 2
    (tmp_path / "empty.jsonl").write_text("")
    assert main(["eval-alerts", str(tmp_path / "empty.jsonl"), "--out", str(tmp_path / "o")]) == 2
    assert "empty" in capsys.readouterr().err


def test_negative_rounds_are_refused(tmp_path: Path) -> None:
    assert main(["eval-alerts", str(data(tmp_path)), "--out", str(tmp_path / "o"), "--rounds", "-1"]) == 2


@pytest.mark.parametrize(
    ("rows", "why"),
    [
        (None, "cannot read"),  # no turns.jsonl
        ("{not json\n", "cannot read"),
        (json.dumps({"id": "other", "v": 1, "turns": 1}) + "\n", "no row"),
        (json.dumps({"id": "c1", "v": 1, "turns": 9}) + "\n", "does not match"),
        (json.dumps({"id": "c1", "v": 99, "turns": 1}) + "\n", "does not match"),
    ],
)
def test_rows_that_cannot_be_used_are_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], rows: str | None, why: str
) -> None:
    earlier = tmp_path / "earlier"
    earlier.mkdir()
    if rows is not None:
        (earlier / "turns.jsonl").write_text(rows)
    argv = ["eval-alerts", str(data(tmp_path)), "--out", str(tmp_path / "o"), "--rows", str(earlier)]
    assert main(argv) == 2
    assert why in capsys.readouterr().err


def test_rows_decide_again_without_vllm(tmp_path: Path) -> None:
    """A one-turn conversation whose final verdict was incomplete: the conversation_incomplete alert again."""
    earlier = tmp_path / "earlier"
    earlier.mkdir()
    row = {"v": 1, "id": "c1", "turns": 1, "cut_after": None, "trees": {"1": [2, -3.0]}, "p_end": {"1": 0.1}}
    (earlier / "turns.jsonl").write_text(json.dumps({**row, "final": False, "cut_final": None}) + "\n")
    out = tmp_path / "o"
    argv = ["eval-alerts", str(data(tmp_path)), "--out", str(out), "--rows", str(earlier), "--rounds", "0"]
    assert main(argv) == 0
    [again] = [json.loads(line) for line in (out / "turns.jsonl").read_text().splitlines()]
    assert again["alerts"] == [["conversation_incomplete", 1, 0, 0]]
    assert (out / "alerts.html").exists() and (out / "alerts.md").exists()
