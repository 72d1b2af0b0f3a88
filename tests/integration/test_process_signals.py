"""A stop asked for at any moment of start-up ends ``sidecar run`` cleanly (exit 0).

Regression: on a loaded node the imports alone take seconds; a SIGTERM (a rolling deploy, a
rebalance test) that arrived before the event loop installed its handlers killed the process with
the default action (exit -15), half-started. Nothing is lost either way (nothing was processed),
but a clean stop is what the orchestrator and the operator expect.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sidecar.tools.demo.mock_cluster import MockKafkaCluster
from tests.integration.kafka_support import REPO, write_config


# From the moment the interpreter runs the sidecar's first line (a few tens of milliseconds after
# exec; no Python process can handle a signal before that).
@pytest.mark.parametrize("after_seconds", [0.3, 0.8, 1.5, 3.0])
def test_sigterm_at_any_moment_of_start_up_is_a_clean_stop(tmp_path: Path, after_seconds: float) -> None:
    with MockKafkaCluster(1) as kafka:
        cfg = write_config(tmp_path / "s.yaml", kafka.bootstrap_servers, "sig")
        proc = subprocess.Popen(
            [sys.executable, "-m", "sidecar", "run", "--config", str(cfg)],
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        time.sleep(after_seconds)
        proc.send_signal(signal.SIGTERM)
        try:
            _, err = proc.communicate(timeout=90)
        finally:
            if proc.poll() is None:
                proc.kill()
    assert proc.returncode == 0, err.decode(errors="replace")[-2000:]


def test_a_stop_during_the_imports_is_remembered_and_the_app_never_starts(tmp_path: Path) -> None:
    """The same, deterministic: the signal lands right after the entry point's first line, while the
    rest is still to import (as ``sidecar/__main__.py`` orders it)."""
    entry = (
        "from sidecar.lifecycle import catch_early_stop\n"
        "catch_early_stop()\n"
        "import os, signal\n"
        "os.kill(os.getpid(), signal.SIGTERM)\n"
        "from sidecar.cli import main\n"
        "raise SystemExit(main(['run', '--config', %r]))\n"
    )
    with MockKafkaCluster(1) as kafka:
        cfg = write_config(tmp_path / "s.yaml", kafka.bootstrap_servers, "early")
        done = subprocess.run(
            [sys.executable, "-c", entry % str(cfg)], check=False, cwd=REPO, capture_output=True, text=True, timeout=90
        )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "sidecar.stopped_before_start" in done.stderr
    assert "kafka.assigned" not in done.stderr and "sidecar.started" not in done.stderr


def test_the_entry_point_arms_the_handler_before_anything_else() -> None:
    lines = [x for x in (REPO / "sidecar" / "__main__.py").read_text().splitlines() if x.strip()]
    assert lines[0] == "from sidecar.lifecycle import catch_early_stop"
    assert lines[1].startswith("catch_early_stop()")
