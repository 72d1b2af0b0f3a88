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
