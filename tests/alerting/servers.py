"""Real destinations for the sink tests: private Mosquitto brokers and an Alertmanager, each a child
process on free loopback ports with its own config and data in a temp directory, so no test ever
stops or reconfigures the machine's shared broker."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

from sidecar.tools.ports import free_port

START_TIMEOUT_SECONDS = 20.0


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def require_binary(name: str, install: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise RuntimeError(f"{name} is not installed: {install} (bash .ci/setup does it)")
    return path


def _wait(what: str, ready: object, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}: {log.read_text()[-2000:]}")
        if callable(ready) and ready():
            return
        time.sleep(0.05)
    raise RuntimeError(f"{what} did not become ready in {START_TIMEOUT_SECONDS:.0f}s: {log.read_text()[-2000:]}")


def _stop(proc: subprocess.Popen[bytes] | None, sig: int = signal.SIGTERM) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(sig)
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


class Mosquitto:
    """A private broker: ``start()``/``stop()`` as often as a test likes, same port and data each time."""

    def __init__(self, workdir: Path, *, extra_config: str = "", listener_options: str = "") -> None:
        self.binary = require_binary("mosquitto", "apt-get install -y mosquitto")
        self.dir = workdir
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.log = self.dir / "mosquitto.log"
        self.config = self.dir / "mosquitto.conf"
        lines = [
            f"listener {self.port} 127.0.0.1",
            listener_options,
            "allow_anonymous true" if "password_file" not in extra_config else "",
            "persistence true",
            f"persistence_location {self.dir}/",
            f"log_dest file {self.log}",
            "log_type all",
            # Started as root, mosquitto would switch to its own user and lose access to the temp dir.
            "user root" if os.geteuid() == 0 else "",
            extra_config,
        ]
        self.config.write_text("\n".join(line for line in lines if line) + "\n")
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [self.binary, "-c", str(self.config)], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT
        )
        _wait("mosquitto", lambda: port_open(self.port), self.proc, self.log)

    def stop(self) -> None:
        """SIGTERM: the broker saves its sessions to the persistence file and exits."""
        _stop(self.proc)
        self.proc = None


class Alertmanager:
    """Debian's ``prometheus-alertmanager`` with a null receiver and clustering off."""

    CONFIG = 'route:\n  receiver: "null"\nreceivers:\n  - name: "null"\n'

    def __init__(self, workdir: Path) -> None:
        self.binary = require_binary("prometheus-alertmanager", "apt-get install -y prometheus-alertmanager")
        self.dir = workdir
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = self.dir / "alertmanager.log"
        (self.dir / "alertmanager.yml").write_text(self.CONFIG)
        self.proc: subprocess.Popen[bytes] | None = None

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=1) as r:
                return int(r.status) == 200
        except OSError:
            return False

    def start(self) -> None:
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                [
                    self.binary,
                    f"--config.file={self.dir / 'alertmanager.yml'}",
                    f"--storage.path={self.dir / 'data'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                    "--cluster.listen-address=",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        _wait("alertmanager", self._ready, self.proc, self.log)

    def stop(self) -> None:
        _stop(self.proc)
        self.proc = None


async def wait_until(predicate: Callable[[], bool], what: str, timeout_seconds: float = 20.0) -> None:
    """Poll ``predicate``; fail naming ``what`` if it is still false after the (generous) deadline."""
    deadline = time.monotonic() + timeout_seconds
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)
