"""Port picking for local servers, and the vLLM launcher picking again when its port was taken.

CI once lost every vLLM test of a run to one ``Address already in use``: the port was free when
picked from the ephemeral range and an outgoing connection held it a minute later, when vLLM bound.
"""

from __future__ import annotations

import socket
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from sidecar.tools import ports
from sidecar.tools.local_vllm import PORT_RETRIES, LocalVllmServer, LocalVllmSpec
from sidecar.tools.ports import bindable, ephemeral_range, free_port


@pytest.fixture
def listener() -> Iterator[int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield int(s.getsockname()[1])


def test_ports_are_picked_below_the_ephemeral_range() -> None:
    low, _ = ephemeral_range()
    picked = {free_port() for _ in range(20)}
    assert all(ports.LOWEST_PORT <= p < low for p in picked), picked
    assert len(picked) > 1  # random, so two processes picking at once rarely agree


def test_a_port_someone_listens_on_is_not_picked(listener: int, monkeypatch: pytest.MonkeyPatch) -> None:
    assert not bindable("127.0.0.1", listener)
    offered = iter([listener, listener, 23456])
    monkeypatch.setattr(ports._rng, "randrange", lambda lo, hi: next(offered))
    assert free_port(ephemeral=(listener + 1, 60999)) == 23456


def test_a_range_with_no_room_below_falls_back_to_the_kernel() -> None:
    port = free_port(ephemeral=(ports.LOWEST_PORT + 10, 60999))
    assert bindable("127.0.0.1", port)


def test_wildcard_hosts_are_checked_on_loopback() -> None:
    assert bindable("127.0.0.1", free_port("0.0.0.0"))


@pytest.mark.parametrize("text", ["", "garbage", "1 2 3", "\x00\xff"])
def test_an_unreadable_range_file_gives_linux_defaults(tmp_path: Path, text: str) -> None:
    path = tmp_path / "range"
    path.write_text(text, errors="replace")
    assert ephemeral_range(path) == ports.DEFAULT_EPHEMERAL_RANGE
    assert ephemeral_range(tmp_path / "absent") == ports.DEFAULT_EPHEMERAL_RANGE


# A stand-in for vLLM's interpreter: the first `fail_times` starts die as vLLM does when its port is
# taken; the next one serves /v1/models with the served names on the port it was given.
FAKE_VLLM = """\
#!{python}
import http.server, json, pathlib, sys
counter = pathlib.Path({counter!r})
starts = int(counter.read_text()) if counter.exists() else 0
counter.write_text(str(starts + 1))
port = int(sys.argv[sys.argv.index("--port") + 1])
with open({ports_seen!r}, "a") as f:
    f.write(f"{{port}}\\n")
if starts < {fail_times}:
    print("OSError: [Errno 98] Address already in use", flush=True)
    sys.exit(1)
class Models(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({{"data": [{{"id": "base"}}]}}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", port), Models).serve_forever()
"""


def _fake_vllm(tmp_path: Path, fail_times: int, message: str | None = None) -> Path:
    script = tmp_path / "fake-python"
    text = FAKE_VLLM.format(
        python=sys.executable,
        counter=str(tmp_path / "starts"),
        ports_seen=str(tmp_path / "ports"),
        fail_times=fail_times,
    )
    if message is not None:
        text = text.replace("Address already in use", message)
    script.write_text(text)
    script.chmod(0o755)
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    return script


def test_a_start_whose_port_was_taken_starts_again_on_another(tmp_path: Path) -> None:
    server = LocalVllmServer(LocalVllmSpec(model_dir=tmp_path / "model"), tmp_path / "vllm.log",
                             python=_fake_vllm(tmp_path, fail_times=2))  # fmt: skip
    server.start()
    try:
        server.wait_ready_blocking(30)
        seen = [int(p) for p in (tmp_path / "ports").read_text().split()]
        assert len(seen) == 3
        assert server.port == seen[-1]
        assert bindable("127.0.0.1", seen[-1]) is False  # the third start serves there
    finally:
        server.stop()


def test_starts_stop_being_retried_after_a_few_attempts(tmp_path: Path) -> None:
    server = LocalVllmServer(LocalVllmSpec(model_dir=tmp_path / "model"), tmp_path / "vllm.log",
                             python=_fake_vllm(tmp_path, fail_times=100))  # fmt: skip
    server.start()
    with pytest.raises(RuntimeError, match="Address already in use"):
        server.wait_ready_blocking(30)
    assert len((tmp_path / "ports").read_text().split()) == PORT_RETRIES + 1


def test_other_start_failures_and_named_ports_are_not_retried(tmp_path: Path) -> None:
    python = _fake_vllm(tmp_path, fail_times=1, message="ValueError: no such model")
    server = LocalVllmServer(LocalVllmSpec(model_dir=tmp_path / "model"), tmp_path / "vllm.log", python=python)
    server.start()
    with pytest.raises(RuntimeError, match="no such model"):
        server.wait_ready_blocking(30)
    assert len((tmp_path / "ports").read_text().split()) == 1

    # A port the spec names is the user's choice: a clash there is reported, not worked around.
    (tmp_path / "starts").unlink()
    (tmp_path / "ports").unlink()
    python.write_text(python.read_text().replace("no such model", "Address already in use"))
    named = LocalVllmServer(LocalVllmSpec(model_dir=tmp_path / "model", port=free_port()), tmp_path / "named.log",
                            python=python)  # fmt: skip
    named.start()
    with pytest.raises(RuntimeError, match="Address already in use"):
        named.wait_ready_blocking(30)
    assert len((tmp_path / "ports").read_text().split()) == 1


def test_an_earlier_runs_clash_in_an_appended_log_does_not_trigger_a_retry(tmp_path: Path) -> None:
    log = tmp_path / "vllm.log"
    log.write_text(textwrap.dedent("OSError: [Errno 98] Address already in use\n"))
    python = _fake_vllm(tmp_path, fail_times=1, message="ValueError: no such model")
    server = LocalVllmServer(LocalVllmSpec(model_dir=tmp_path / "model"), log, python=python)
    server.start()
    with pytest.raises(RuntimeError, match="no such model"):
        server.wait_ready_blocking(30)
    assert len((tmp_path / "ports").read_text().split()) == 1
