"""The eval server wrapper never leaves a process behind when start-up fails."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from adapters.serving.vllm_server import VllmServer


def _fake_python(tmp_path: Path, body: str) -> Path:
    (tmp_path / "config.json").write_text("{}")  # a model directory, as far as the launcher checks
    script = tmp_path / "fake-python"
    script.write_text(f"#!/bin/sh\n{body}\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return script


def test_exiting_server_is_reported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SIDECAR_VLLM_PYTHON", str(_fake_python(tmp_path, "echo boom; exit 3")))
    server = VllmServer(tmp_path, {}, tmp_path / "log.txt", startup_timeout_seconds=30)
    with pytest.raises(RuntimeError, match="exited with 3"):
        server.start()
    assert "boom" in (tmp_path / "log.txt").read_text()
    server.stop()
    server.stop()  # idempotent


def test_never_ready_server_is_killed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pid_file = tmp_path / "pid"
    monkeypatch.setenv("SIDECAR_VLLM_PYTHON", str(_fake_python(tmp_path, f"echo $$ > {pid_file}; exec sleep 60")))
    server = VllmServer(tmp_path, {"x": tmp_path}, tmp_path / "log.txt", startup_timeout_seconds=3)
    with pytest.raises(TimeoutError):
        server.start()
    pid = int(pid_file.read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
