"""End to end: a real Prometheus scrapes a running sidecar with the chart's rules loaded, a rule
fires, and a real Alertmanager receives the alert. The same Prometheus evaluates every dashboard
query, so a PromQL mistake in a panel fails here rather than in Grafana.

Both servers are Debian's (prometheus, prometheus-alertmanager), started on free loopback ports
with temporary storage, and stopped by the test. The rules are the chart's, rendered from the
ci/e2e-alerts scenario, whose dead-letter alert has a low threshold and no `for` delay; the
sidecar gets malformed records until the alert arrives.
"""

from __future__ import annotations

import json
import time
import urllib.parse
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from tests.deploy.chart import CHART, render, rule_groups
from tests.deploy.conftest import RunningSidecar
from tests.support.monitoring import Server, start_alertmanager, start_prometheus

JOB = "llm-agent-sidecar"
ALERT = "SidecarDeadLetterRateHigh"
START_SECONDS = 30.0
ALERT_SECONDS = 120.0
# Values for Grafana's variables when a dashboard query is evaluated outside Grafana.
GRAFANA_VARIABLES = {
    "$__rate_interval": "1m",
    "$__range": "5m",
    # As Grafana sends "All": .* for cluster, so series without a cluster label still match.
    "$cluster": ".*",
    "$namespace": ".+",
    "$job": ".+",
    "$agent": ".+",
    "$goal": ".+",
    "$instance": ".+",
    "$model": ".+",
    "$vllm_job": ".+",
}


@pytest.fixture(scope="module")
def alertmanager(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    server = start_alertmanager(tmp_path_factory.mktemp("alertmanager"), {
        "route": {"receiver": "sink", "group_wait": "1s", "group_interval": "1s", "repeat_interval": "1h"},
        "receivers": [{"name": "sink"}],
    })  # fmt: skip
    yield server
    server.stop()


@pytest.fixture(scope="module")
def prometheus(
    helm: str, running_sidecar: RunningSidecar, alertmanager: Server, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("prometheus")
    rules = root / "rules.yaml"
    rules.write_text(yaml.safe_dump({"groups": rule_groups(render([CHART / "ci" / "e2e-alerts-values.yaml"]))}))
    am = urllib.parse.urlsplit(alertmanager.url).netloc
    server = start_prometheus(root, {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(rules)],
        "alerting": {"alertmanagers": [{"static_configs": [{"targets": [am]}]}]},
        "scrape_configs": [{
            "job_name": JOB,
            "static_configs": [{"targets": [f"127.0.0.1:{running_sidecar.port}"], "labels": {"namespace": "e2e"}}],
        }],
    })  # fmt: skip
    yield server
    server.stop()


def query(prometheus: Server, expr: str) -> dict[str, Any]:
    answer: dict[str, Any] = prometheus.get_json("/api/v1/query?" + urllib.parse.urlencode({"query": expr}))
    return answer


def wait_scraped(prometheus: Server) -> None:
    deadline = time.monotonic() + START_SECONDS
    while time.monotonic() < deadline:
        result = query(prometheus, f'up{{job="{JOB}"}} == 1')["data"]["result"]
        if result:
            return
        time.sleep(0.5)
    pytest.fail(f"Prometheus never scraped the sidecar:\n{prometheus.log_tail()}")


def test_a_rule_fires_and_alertmanager_receives_it(
    running_sidecar: RunningSidecar, prometheus: Server, alertmanager: Server
) -> None:
    wait_scraped(prometheus)
    deadline = time.monotonic() + ALERT_SECONDS
    received: list[dict[str, Any]] = []
    wave = 0
    while time.monotonic() < deadline and not received:
        # Records keep arriving, a share of them malformed: the dead-letter rate stays up.
        wave += 1
        running_sidecar.produce_conversations(2, f"e2e-{wave}")
        running_sidecar.produce_malformed(f"e2e-{wave}")
        time.sleep(1.0)
        alerts = alertmanager.get_json("/api/v2/alerts?" + urllib.parse.urlencode({"filter": f'alertname="{ALERT}"'}))
        received = [a for a in alerts if a["labels"].get("alertname") == ALERT]
    assert received, (
        f"no {ALERT} at Alertmanager after {ALERT_SECONDS:.0f} s; Prometheus alerts: "
        f"{prometheus.get_json('/api/v1/alerts')}\n{prometheus.log_tail()}"
    )
    alert = received[0]
    assert alert["labels"]["severity"] == "warning"
    assert alert["labels"]["job"] == JOB
    assert alert["labels"]["namespace"] == "e2e"
    assert alert["annotations"]["runbook_url"].endswith(f"/deploy/runbooks/{ALERT}.md")
    assert "went to the dead-letter topic" in alert["annotations"]["description"]
    assert alert["status"]["state"] == "active"


def dashboard_queries() -> Iterator[tuple[str, str, str]]:
    for path in sorted((CHART / "dashboards").glob("*.json")):
        dashboard = json.loads(path.read_text())
        for row in dashboard["panels"]:
            for panel in [row, *row.get("panels", [])]:
                for target in panel.get("targets", []):
                    expr = target["expr"]
                    for var, value in sorted(GRAFANA_VARIABLES.items(), key=lambda kv: -len(kv[0])):
                        expr = expr.replace(var, value)
                    yield path.stem, panel["title"], expr


def test_every_dashboard_query_evaluates(running_sidecar: RunningSidecar, prometheus: Server) -> None:
    wait_scraped(prometheus)
    failures = []
    for dashboard, title, expr in dashboard_queries():
        assert "$" not in expr, f"{dashboard} / {title}: a Grafana variable the test does not know"
        try:
            answer = query(prometheus, expr)
        except OSError as exc:  # a 400 carries Prometheus's parse error in its body
            failures.append(f"{dashboard} / {title}: {getattr(exc, 'read', lambda: b'')().decode()[:300]}")
            continue
        if answer.get("status") != "success":
            failures.append(f"{dashboard} / {title}: {answer}")
    assert failures == []
    # The scrape is real: the pipeline panels have data.
    running_sidecar.produce_conversations(5, "dash")
    rate = f'sum(rate(sidecar_events_consumed_total{{job="{JOB}"}}[1m])) > 0'
    deadline = time.monotonic() + START_SECONDS
    while not query(prometheus, rate)["data"]["result"]:
        assert time.monotonic() < deadline, "no consumption rate in Prometheus"
        time.sleep(0.5)
