"""``sidecar judge`` refuses bad arguments and inputs with clear errors (no endpoint needed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sidecar.cli import main


@pytest.fixture
def data(tmp_path: Path) -> Path:
    path = tmp_path / "convs.jsonl"
    turns = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    rec = {"conversation_id": "c1", "turns": turns}
    path.write_text(json.dumps(rec) + "\n")
    path.with_suffix(".gz").write_bytes(b"{not json")
    return path


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--limit", "0"], "must be at least 1"),
        (["--limit", "ten"], "is not a whole number"),
        (["--max-tokens", "-5"], "must be at least 1"),
        (["--concurrency", "1.5"], "is not a whole number"),
        (["--protocol", "random"], "invalid choice"),
        (["--structured-output", "xml"], "invalid choice"),
    ],
)
def test_bad_numbers_are_usage_errors(
    data: Path, capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["judge", str(data), *extra])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (lambda d, t: [str(t / "missing.jsonl")], "does not exist"),
        (lambda d, t: [str(t)], "is not a regular file"),
        (lambda d, t: [str(d), "--max-file-bytes", "10"], "the limit is 10"),
        (lambda d, t: [str(d), "--max-tokens", "4"], "invalid judge options"),
        (lambda d, t: [str(d), "--label-field", "meta.x", "--protocol", "truncation"], "exclusive"),
        (lambda d, t: [str(d), "--output", str(t / "no" / "out.jsonl")], "directory"),
        (lambda d, t: [str(d), "--compare", str(d)], "--compare needs --compare-section"),
        (lambda d, t: [str(d), "--compare", str(d), "--compare-section", "sgd"], "no rows in section 'sgd'"),
        (lambda d, t: [str(d), "--compare", str(d.with_suffix(".gz")), "--compare-section", "sgd"], "not JSON"),
        (lambda d, t: [str(d), "--api-key-env", "SIDECAR_TEST_UNSET_VARIABLE"], "is not set"),
        (lambda d, t: [str(d), "--agent-description-file", str(t / "none.txt")], "does not exist"),
    ],
)
def test_bad_inputs_exit_2_with_a_message(
    data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: object, message: str
) -> None:
    assert main(["judge", *argv(data, tmp_path)]) == 2  # type: ignore[operator]
    assert message in capsys.readouterr().err


def test_a_file_without_valid_conversations_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text("{nope\n[1]\n")
    assert main(["judge", str(path)]) == 2
    assert "no valid conversation" in capsys.readouterr().err


def test_an_unreachable_endpoint_is_a_failure_not_a_crash(
    data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    summary = tmp_path / "s.json"
    rc = main(["judge", str(data), "--base-url", "http://127.0.0.1:9/v1", "--max-attempts", "1", "--summary",
               str(summary)])  # fmt: skip
    assert rc == 1
    doc = json.loads(summary.read_text())
    assert doc["errors"] == {"accuracy": 1, "completeness": 1} and doc["verdicts"]["undecided"] == 1


def test_an_unwritable_output_is_a_failure_with_a_message(data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # /proc exists, but no file can be created in it, even by root.
    rc = main(["judge", str(data), "--base-url", "http://127.0.0.1:9/v1", "--max-attempts", "1", "--output",
               "/proc/verdicts.jsonl"])  # fmt: skip
    assert rc == 1
    assert "cannot write the results" in capsys.readouterr().err
