"""Goal spec files: spec lines, the datasets' goal fields, bad lines counted, bad files refused."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from sidecar.errors import ConfigError
from sidecar.tools.simulator.goals import dataset_goal, load_goals


def write(path: Path, records: list[Any]) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return path


def test_goal_specs_and_dataset_records(tmp_path: Path) -> None:
    records = [
        {"goal": "Book a taxi to the station.", "goal_id": "taxi", "domain": "taxi"},
        {"goal": "  Find   a museum.  "},
        {"conversation_id": "optimouse/1", "source": "optimouse", "meta": {"problem_statement": "A store sells..."}},
        {"conversation_id": "tau/1", "meta": {"user_instruction": "You are Olivia and want to change a flight."}},
        {"conversation_id": "star/1", "domain": "doctor", "meta": {"user_task": "Follow up with Dr. Morgan."}},
        {"conversation_id": "multiwoz/1", "meta": {"goal_message": [
            "You are looking for a <span class='emphasis'>place to stay</span>", "It should be cheap &amp; quiet."]}},
    ]  # fmt: skip
    goals, stats = load_goals(write(tmp_path / "g.jsonl", records), max_file_bytes=10**6, max_goal_chars=1000)
    assert [g.goal_id for g in goals] == ["taxi", "line-2", "optimouse/1", "tau/1", "star/1", "multiwoz/1"]
    assert goals[1].goal == "Find a museum." and goals[0].domain == "taxi" and goals[4].domain == "doctor"
    assert goals[5].goal == "You are looking for a place to stay. It should be cheap & quiet."
    assert goals[2].source == "optimouse" and stats.records == 6 and stats.skipped == {}


def test_bad_lines_are_skipped_and_counted(tmp_path: Path) -> None:
    records = [
        "{not json", "[1, 2]", {"goal": ""}, {"goal": 5}, {"goal": "ok", "goal_id": True},
        {"conversation_id": "sgd/1", "meta": {"services": ["Flights"]}}, {"goal": "x" * 500},
        {"goal": "first", "goal_id": "same"}, {"goal": "second", "goal_id": "same"}, {"something": "else"},
    ]  # fmt: skip
    goals, stats = load_goals(write(tmp_path / "g.jsonl", records), max_file_bytes=10**6, max_goal_chars=100)
    assert [g.goal for g in goals] == ["first"]
    assert stats.skipped == {"invalid_json": 1, "not_an_object": 1, "no_goal": 4, "bad_goal_id": 1,
                             "goal_too_long": 1, "duplicate_goal_id": 1}  # fmt: skip


def test_limit_and_gzip(tmp_path: Path) -> None:
    path = tmp_path / "g.jsonl.gz"
    with gzip.open(path, "wt") as fh:
        for i in range(10):
            fh.write(json.dumps({"goal": f"goal {i}"}) + "\n")
    goals, _ = load_goals(path, max_file_bytes=10**6, max_goal_chars=100, limit=3)
    assert [g.goal for g in goals] == ["goal 0", "goal 1", "goal 2"]


def test_bad_files_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_goals(tmp_path / "missing.jsonl", max_file_bytes=100, max_goal_chars=100)
    with pytest.raises(ConfigError, match="not a regular file"):
        load_goals(tmp_path, max_file_bytes=100, max_goal_chars=100)
    big = write(tmp_path / "big.jsonl", [{"goal": "x" * 300}])
    with pytest.raises(ConfigError, match="the limit is 100"):
        load_goals(big, max_file_bytes=100, max_goal_chars=1000)
    broken = tmp_path / "broken.jsonl.gz"
    broken.write_bytes(b"not gzip at all")
    with pytest.raises(ConfigError, match="not a readable gzip"):
        load_goals(broken, max_file_bytes=1000, max_goal_chars=1000)


def test_dataset_goal_of_records_without_one() -> None:
    assert dataset_goal({"meta": None}) == "" and dataset_goal({}) == ""
    assert dataset_goal({"meta": {"goal_message": [1, None]}}) == ""
