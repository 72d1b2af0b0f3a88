"""Debian's Prometheus and Alertmanager (prometheus, prometheus-alertmanager) as test servers.

Each starter writes the server's YAML config under a root folder the test owns, runs the binary on
a free loopback port with its storage and log under the same root, and waits until the server
answers its readiness endpoint; a server that exits or never gets ready fails the test with the
tail of its log. The test stops the server with :meth:`Server.stop`. A missing binary fails the
test with the install command, as the deploy tests' other tools do.
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from sidecar.tools.ports import free_port
from tests.deploy.chart import ToolMissing, tool

START_SECONDS = 30.0
LOG_TAIL_CHARS = 3000


@dataclass
class Server:
    """A running server process: its base URL, the process, and the file its output goes to."""

    url: str
    process: subprocess.Popen[bytes]
    log: Path

    def get_json(self, path: str) -> Any:
        """GET ``path`` and decode the JSON answer; an HTTP error status raises (an OSError)."""
        with urllib.request.urlopen(self.url + path, timeout=5.0) as resp:
            return json.loads(resp.read())

    def stop(self) -> None:
        """Terminate the process, killing it if it does not exit within 10 s."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def log_tail(self) -> str:
        """The end of the server's output, for failure messages."""
        return self.log.read_text(errors="replace")[-LOG_TAIL_CHARS:]


def binary(name: str) -> str:
    """Path of the command ``name``; fails the test (rather than skipping it) when it is not installed."""
    try:
        return tool(name)
    except ToolMissing as exc:
        pytest.fail(str(exc))


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2):
            return True
    except OSError:
        return False


def start_server(name: str, argv: list[str], url: str, ready_path: str, log: Path) -> Server:
    """Run ``argv`` with its output in ``log`` and wait until ``url + ready_path`` answers.

    Fails the test with the log tail when the process exits first or is not ready in time.
    """
    with log.open("wb") as out:
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    server = Server(url, process, log)
    deadline = time.monotonic() + START_SECONDS
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"{name} exited:\n{server.log_tail()}")
        if _ready(url + ready_path):
            return server
        time.sleep(0.2)
    server.stop()
    pytest.fail(f"{name} did not start:\n{server.log_tail()}")


def _write_config(path: Path, config: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(config))
    return path


def start_alertmanager(root: Path, config: dict[str, Any]) -> Server:
    """An Alertmanager with ``config``, storage under ``root`` and clustering off (no gossip port)."""
    path = _write_config(root / "alertmanager.yml", config)
    port = free_port()
    argv = [
        binary("prometheus-alertmanager"),
        f"--config.file={path}",
        f"--storage.path={root / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--cluster.listen-address=",
    ]
    return start_server("alertmanager", argv, f"http://127.0.0.1:{port}", "/-/ready", root / "alertmanager.log")


def start_prometheus(root: Path, config: dict[str, Any], *, extra_args: Sequence[str] = ()) -> Server:
    """A Prometheus with ``config`` and its TSDB under ``root``; ``extra_args`` go after the usual flags."""
    path = _write_config(root / "prometheus.yml", config)
    port = free_port()
    argv = [
        binary("prometheus"),
        f"--config.file={path}",
        f"--storage.tsdb.path={root / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
        *extra_args,
    ]
    return start_server("prometheus", argv, f"http://127.0.0.1:{port}", "/-/ready", root / "prometheus.log")
