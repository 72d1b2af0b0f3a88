"""``sidecar eval`` usage errors: each is a clear message and exit 2 (bad input or usage) or exit 1
(vLLM unreachable), before anything is scored."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from sidecar.cli import main
from tests.eval.test_dataset import GOOD


@pytest.fixture
def data(tmp_path: Path) -> Path:
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps(GOOD) + "\n", encoding="utf-8")
    return path


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["eval"], "the following arguments are required: input, --out"),
        (["eval", "x.jsonl"], "the following arguments are required: --out"),
        (["eval", "{data}", "--out", "{out}", "--concurrency", "0"], "0 must be at least 1"),
        (["eval", "{data}", "--out", "{out}", "--limit", "ten"], "'ten' is not a whole number"),
        (["eval", "{data}", "--out", "{out}", "--tree-turns", "some"], "invalid choice: 'some'"),
        (["eval", "{data}", "--out", "{out}", "--goals", "magic"], "invalid choice: 'magic'"),
    ],
)
def test_bad_arguments_exit_2(
    argv: list[str], message: str, data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = [a.format(data=data, out=tmp_path / "out") for a in argv]
    with pytest.raises(SystemExit) as exc:
        main(args)
    assert exc.value.code == 2 and message in capsys.readouterr().err


def test_input_problems_exit_2(tmp_path: Path, data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"")
    junk = tmp_path / "junk.jsonl"
    junk.write_text("{nope\n", encoding="utf-8")
    a_file = tmp_path / "file"
    a_file.write_text("x", encoding="utf-8")
    cases = [
        (["eval", str(tmp_path / "missing.jsonl"), "--out", str(tmp_path / "o")], "does not exist"),
        (["eval", str(empty), "--out", str(tmp_path / "o")], "is empty"),
        (["eval", str(junk), "--out", str(tmp_path / "o")], "no valid conversation (line 1: invalid json)"),
        (["eval", str(data), "--out", str(tmp_path / "o"), "--max-input-bytes", "10"], "the limit is 10"),
        (["eval", str(data), "--out", str(tmp_path / "o")], "needs the served model's tokenizer"),
        (["eval", str(data), "--out", str(a_file), "--model-dir", str(tmp_path)], "is not a directory"),
    ]
    for argv, message in cases:
        assert main(argv) == 2, argv
        assert message in capsys.readouterr().err, argv


def test_unreachable_vllm_exits_1_and_writes_no_rows(
    tmp_path: Path, data: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    url = f"http://127.0.0.1:{closed_port()}/v1"
    rc = main(["eval", str(data), "--out", str(out), "--vllm-url", url, "--model-dir", str(tmp_path)])
    assert rc == 1
    assert f"vLLM at {url} does not answer" in capsys.readouterr().err
    assert not (out / "results.jsonl").exists() or (out / "results.jsonl").read_text() == ""


def test_resume_with_other_settings_is_refused(tmp_path: Path, data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "results.jsonl").write_text(json.dumps({"id": "star/1"}) + "\n", encoding="utf-8")
    (out / "run.json").write_text(json.dumps({"settings": {"alpha": 0.5}}), encoding="utf-8")
    rc = main(
        ["eval", str(data), "--out", str(out), "--vllm-url", "http://127.0.0.1:9/v1", "--model-dir", str(tmp_path)]
    )
    err = capsys.readouterr().err
    assert rc == 2 and "holds results made with other settings (alpha, base_model," in err and "--restart" in err


def test_bundled_without_the_model_or_vllm_exits_2(
    tmp_path: Path, data: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from sidecar.tools.demo import models

    monkeypatch.setattr(models, "scoring_unavailable_reason", lambda: "no vLLM interpreter at /nowhere")
    assert main(["eval", str(data), "--out", str(tmp_path / "o"), "--bundled"]) == 2
    assert "--bundled: no vLLM interpreter at /nowhere" in capsys.readouterr().err
