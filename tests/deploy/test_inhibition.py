"""The inhibition example (deploy/alertmanager/inhibit-rules.yaml) on a real Alertmanager: with
vLLM down, the breaker alert pages and its consequences of the same release are inhibited, while the
same consequences of another release still page."""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.chart import DEPLOY
from tests.support.monitoring import Server, binary, start_alertmanager

RULES = DEPLOY / "alertmanager" / "inhibit-rules.yaml"


@pytest.fixture
def alertmanager(tmp_path: Path) -> Iterator[Server]:
    config = {
        "route": {"receiver": "sink", "group_wait": "1s", "group_interval": "1s", "repeat_interval": "1h"},
        "receivers": [{"name": "sink"}],
        **yaml.safe_load(RULES.read_text()),
    }
    server = start_alertmanager(tmp_path, config)
    yield server
    server.stop()


def _post(server: Server, alerts: list[dict[str, str]]) -> None:
    now = datetime.now(UTC)
    body = [
        {"labels": labels, "startsAt": now.isoformat(), "endsAt": (now + timedelta(minutes=10)).isoformat()}
        for labels in alerts
    ]
    req = urllib.request.Request(
        server.url + "/api/v2/alerts", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=10) as r:
        assert r.status == 200


def _states(server: Server) -> dict[tuple[str, str], list[Any]]:
    got = server.get_json("/api/v2/alerts?inhibited=true&active=true")
    return {(a["labels"]["alertname"], a["labels"]["job"]): a["status"]["inhibitedBy"] for a in got}


def test_vllm_down_pages_once_per_release(alertmanager: Server) -> None:
    ours = {"namespace": "agents", "job": "shop-sidecar", "severity": "warning"}
    theirs = {"namespace": "agents", "job": "bank-sidecar", "severity": "warning"}
    _post(
        alertmanager,
        [
            {"alertname": "SidecarLlmCircuitBreakerOpen", **ours, "instance": "a:9108", "severity": "critical"},
            {"alertname": "SidecarLlmErrorRateHigh", **ours},
            {"alertname": "SidecarScoringBacklog", **ours, "instance": "a:9108"},
            {"alertname": "SidecarLlmErrorRateHigh", **theirs},
            {"alertname": "SidecarDeadLetterRateHigh", **ours},
        ],
    )
    deadline = time.monotonic() + 20
    states: dict[tuple[str, str], list[Any]] = {}
    while time.monotonic() < deadline:
        states = _states(alertmanager)
        if len(states) == 5 and states[("SidecarLlmErrorRateHigh", "shop-sidecar")]:
            break
        time.sleep(0.3)
    assert states[("SidecarLlmErrorRateHigh", "shop-sidecar")], states
    assert states[("SidecarScoringBacklog", "shop-sidecar")], states
    assert not states[("SidecarLlmCircuitBreakerOpen", "shop-sidecar")], states
    assert not states[("SidecarLlmErrorRateHigh", "bank-sidecar")], states  # another release
    assert not states[("SidecarDeadLetterRateHigh", "shop-sidecar")], states  # another cause


def test_a_replica_not_scraped_hides_its_own_alerts_only(alertmanager: Server) -> None:
    base = {"namespace": "agents", "job": "shop-sidecar", "severity": "warning"}
    _post(
        alertmanager,
        [
            {"alertname": "SidecarDown", **base, "instance": "a:9108", "severity": "critical"},
            {"alertname": "SidecarScoringBacklog", **base, "instance": "a:9108"},
            {"alertname": "SidecarCommitStalled", **base, "instance": "b:9108", "partition": "1"},
        ],
    )
    deadline = time.monotonic() + 20
    got: list[Any] = []
    while time.monotonic() < deadline:
        got = alertmanager.get_json("/api/v2/alerts?inhibited=true&active=true")
        if len(got) == 3 and any(a["status"]["inhibitedBy"] for a in got):
            break
        time.sleep(0.3)
    by = {(a["labels"]["alertname"], a["labels"]["instance"]): a["status"]["inhibitedBy"] for a in got}
    assert by[("SidecarScoringBacklog", "a:9108")], by
    assert not by[("SidecarCommitStalled", "b:9108")], by
    assert not by[("SidecarDown", "a:9108")], by


def test_amtool_accepts_the_example(tmp_path: Path) -> None:
    import subprocess

    config = {"route": {"receiver": "sink"}, "receivers": [{"name": "sink"}], **yaml.safe_load(RULES.read_text())}
    path = tmp_path / "am.yml"
    path.write_text(yaml.safe_dump(config))
    proc = subprocess.run([binary("amtool"), "check-config", str(path)], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "3 inhibit rules" in proc.stdout
