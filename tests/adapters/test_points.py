"""The resumable results file of curve and lodo: atomic saves, damaged files refused, not discarded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from adapters.errors import DataError
from adapters.evaluation import lodo
from adapters.evaluation.points import open_points, save_points


def test_a_new_file_starts_empty_and_a_saved_one_is_read_back_with_this_runs_command(tmp_path: Path) -> None:
    path = tmp_path / "lodo.json"
    doc = open_points(path, "python -m x", ["--a", "1"])
    assert doc == {"points": {}, "command": "python -m x --a 1"}
    doc["points"]["toy/sgd"] = {"roc_auc": 0.9}
    save_points(path, doc)
    assert not list(tmp_path.glob("*.partial"))
    again = open_points(path, "python -m x", ["--b"])
    assert again["points"] == {"toy/sgd": {"roc_auc": 0.9}}
    assert again["command"] == "python -m x --b"


@pytest.mark.parametrize(
    "content",
    [b'{"points": {"toy/sgd": {"roc', b"\xff\xfe" + b"x" * 100_000, b"[1, 2]", b'{"points": [1]}', b"NaN", b""],
    ids=["cut-short", "binary", "a-list", "points-not-a-map", "nan", "empty"],
)
def test_a_damaged_file_is_a_clear_error_and_is_left_as_it_was(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "curve.json"
    path.write_bytes(content)
    with pytest.raises(DataError, match="move it away to start over"):
        open_points(path, "python -m x")
    assert path.read_bytes() == content


def test_an_interrupted_save_leaves_the_previous_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "lodo.json"
    save_points(path, {"points": {"a": 1}})

    def fail(self: Path, target: Path) -> Path:
        raise OSError("disk gone")

    monkeypatch.setattr(Path, "replace", fail)
    with pytest.raises(OSError, match="disk gone"):
        save_points(path, {"points": {"a": 2}})
    assert json.loads(path.read_text()) == {"points": {"a": 1}}


def test_lodo_refuses_a_damaged_results_file_before_any_training(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "lodo.json").write_text('{"points": {"one/alpha": {"st')
    for name in ("alpha", "beta"):
        (tmp_path / "data" / name).mkdir(parents=True)
        (tmp_path / "data" / name / "test.jsonl").write_text("")
    (tmp_path / "base").mkdir()
    (tmp_path / "base" / "config.json").write_text("{}")
    argv = ["--data", str(tmp_path / "data"), "--base", f"one={tmp_path / 'base'}", "--datasets", "alpha,beta"]
    assert lodo.main([*argv, "--work", str(tmp_path / "work"), "--out", str(tmp_path / "out")]) == 2
    assert "move it away to start over" in capsys.readouterr().err
    assert not (tmp_path / "work").exists()
