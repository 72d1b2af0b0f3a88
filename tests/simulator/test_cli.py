"""``sidecar simulate`` refuses bad arguments with clear errors (no endpoint needed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sidecar.cli import main


@pytest.fixture
def goals(tmp_path: Path) -> Path:
    path = tmp_path / "goals.jsonl"
    path.write_text(json.dumps({"goal": "Book a taxi."}) + "\n")
    return path


def base(goals: Path, tmp_path: Path) -> list[str]:
    return [
        "simulate",
        "--goals",
        str(goals),
        "--out",
        str(tmp_path / "ev.jsonl"),
        "--user-url",
        "http://127.0.0.1:9/v1",
    ]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--rate", "-1"], "must be a positive number"),
        (["--rate", "nan"], "must be a positive number"),
        (["--rate", "fast"], "is not a number"),
        (["--concurrency", "0"], "is not in 1..1000"),
        (["--max-turns", "1.5"], "is not a whole number"),
        (["--max-turns", "501"], "is not in 1..500"),
        (["--user-temperature", "3"], "is not in 0..2"),
        (["--request-timeout", "0"], "is not in (0, 3600] seconds"),
        (["--kafka", "localhost:9092"], "not allowed with argument --out"),
        (["--first-speaker", "nobody"], "invalid choice"),
    ],
)
def test_bad_numbers_and_combinations_are_usage_errors(
    goals: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    with pytest.raises(SystemExit) as exc:
        main([*base(goals, tmp_path), *extra])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_out_or_kafka_is_required(goals: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["simulate", "--goals", str(goals), "--user-url", "http://x/v1"])
    assert "one of the arguments --out --kafka is required" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda a, t: [x for x in a if x not in ("--user-url", "http://127.0.0.1:9/v1")], "--user-url is required"),
        (lambda a, t: [*a[:2], str(t / "missing.jsonl"), *a[3:]], "does not exist"),
        (lambda a, t: [*a, "--max-file-bytes", "5"], "the limit is 5"),
        (lambda a, t: [*a[:4], str(t / "no" / "dir" / "ev.jsonl"), *a[5:]], "directory"),
        (lambda a, t: [*a, "--agent", "bad agent!"], "invalid simulate options"),
        (lambda a, t: [*a, "--user-api-key-env", "SIDECAR_TEST_UNSET_VARIABLE"], "is not set"),
        (lambda a, t: [*a, "--assistant-system-prompt-file", str(t / "none.txt")], "does not exist"),
    ],
)
def test_bad_files_and_options_exit_2_with_a_message(
    goals: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], change: object, message: str
) -> None:
    argv = change(base(goals, tmp_path), tmp_path)  # type: ignore[operator]
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_a_file_without_usable_goals_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "goals.jsonl"
    path.write_text('{"conversation_id": "sgd/1", "meta": {}}\n')
    assert main(base(path, tmp_path)) == 2
    assert "no usable goal" in capsys.readouterr().err


@pytest.mark.parametrize("destination", [["--kafka", "127.0.0.1:9"], ["--out", "/proc/events.jsonl"]])
def test_an_unusable_destination_is_a_failure_with_a_message(
    goals: Path, capsys: pytest.CaptureFixture[str], destination: list[str]
) -> None:
    # Nothing listens on port 9; /proc exists but no file can be created in it, even by root.
    argv = ["simulate", "--goals", str(goals), "--user-url", "http://127.0.0.1:9/v1", *destination]
    assert main(argv) == 1
    assert "cannot write the events" in capsys.readouterr().err
