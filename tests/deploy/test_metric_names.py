"""Every metric a dashboard panel, a dashboard variable or a rule reads is really exported:
sidecar_* and process_* names by a running sidecar (scoring, goal clustering and alerting to a
Kafka sink on), vllm:* names by the real vLLM server. ``up`` is Prometheus's own, and the
baselines the rules record are the rules' own. A renamed metric would otherwise blank a panel or
silence an alert without any error."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

from prometheus_client.parser import text_string_to_metric_families

from tests.deploy.chart import CHART, render, rule_groups
from tests.deploy.conftest import RunningSidecar
from tests.deploy.promql import all_metric_names, base_name, exposed_names, metric_names
from tests.support.vllm_server import VllmServer

_LABEL_VALUES = re.compile(r"^\s*label_values\((.*),\s*\w+\s*\)\s*$", re.DOTALL)


def dashboard_exprs() -> Iterator[str]:
    for path in sorted((CHART / "dashboards").glob("*.json")):
        dashboard = json.loads(path.read_text())
        for row in dashboard["panels"]:
            for panel in [row, *row.get("panels", [])]:
                for target in panel.get("targets", []):
                    yield target["expr"]
        for var in dashboard["templating"]["list"]:
            if var["type"] == "query":
                m = _LABEL_VALUES.match(var["query"])
                assert m, f"{path.name} ${var['name']}: only label_values(metric{{...}}, label) queries are used"
                yield m.group(1)


def rule_exprs() -> Iterator[str]:
    for group in rule_groups(render(set_values={"prometheusRule.enabled": "true"})):
        for rule in group["rules"]:
            yield rule["expr"]


def recorded_names() -> set[str]:
    """The series the rules record themselves (the alerts read them; no target exports them)."""
    groups = rule_groups(render(set_values={"prometheusRule.enabled": "true"}))
    return {rule["record"] for group in groups for rule in group["rules"] if "record" in rule}


def test_the_name_extractor() -> None:
    expr = (
        'sum by (agent) (rate(sidecar_x_total{job=~"$job", a="b c"}[$__rate_interval])) / on (agent) '
        "group_left (name) topk by (goal) (1, sidecar_goal_info) or histogram_quantile(0.99, "
        "sum by (le) (rate(vllm:e2e_request_latency_seconds_bucket[5m] offset 1h))) > bool 1e3"
    )
    assert metric_names(expr) == {"sidecar_x_total", "sidecar_goal_info", "vllm:e2e_request_latency_seconds_bucket"}


def test_dashboards_and_rules_use_only_exported_metrics(
    helm: str, running_sidecar: RunningSidecar, vllm_server: VllmServer
) -> None:
    # ``up`` is Prometheus's own series of each scrape (SidecarDown reads it), not an export.
    used = (all_metric_names(dashboard_exprs()) | all_metric_names(rule_exprs())) - {"up"} - recorded_names()
    sidecar = exposed_names(running_sidecar.metrics())
    vllm = exposed_names(vllm_server.metrics_text())
    assert {"sidecar_conversations_ended_total", "sidecar_event_loop_lag_seconds_bucket"} <= used
    missing = sorted(n for n in used if n not in (vllm if n.startswith("vllm:") else sidecar))
    assert missing == [], f"not exported (families: {sorted({base_name(n) for n in missing})})"
    # Every name counts: nothing was dropped as "not a metric" by accident.
    assert all(n.startswith(("sidecar_", "process_", "vllm:")) for n in used), sorted(used)


def test_dashboards_cover_the_pipeline_and_scoring_families(helm: str) -> None:
    """The metrics the issue names all have a panel."""
    used = {base_name(n) for n in all_metric_names(dashboard_exprs())}
    for family in (
        "sidecar_conversations_ended_total", "sidecar_completion_probability", "sidecar_tree_leaves",
        "sidecar_uncertain_turns_total", "sidecar_events_consumed_total", "sidecar_consumer_lag_records",
        "sidecar_events_dead_lettered_total", "sidecar_commit_age_seconds", "sidecar_event_loop_lag_seconds",
        "process_resident_memory_bytes", "sidecar_vllm_prompt_tokens_total", "sidecar_vllm_request_errors_total",
        "sidecar_vllm_request_duration_seconds", "sidecar_vllm_circuit_breaker_state",
        "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total", "sidecar_goal_info",
        # Escalations (fleet overview, row "Escalations") and scoring cost.
        "sidecar_alerts_total", "sidecar_alerts_suppressed_total", "sidecar_alert_delivery_retries_total",
        "sidecar_alert_sink_up", "sidecar_alerts_pending", "sidecar_escalation_latency_seconds",
        "sidecar_uncertainty_score", "sidecar_completion_requests", "sidecar_scoring_skipped_total",
    ):  # fmt: skip
        assert family in used, family


def test_rules_cover_the_escalation_families(helm: str) -> None:
    used = {base_name(n) for n in all_metric_names(rule_exprs())}
    for family in (
        "sidecar_escalation_latency_seconds", "sidecar_alert_sink_up", "sidecar_alert_delivery_retries_total",
        "sidecar_alerts_total", "sidecar_uncertain_turns_total", "sidecar_uncertainty_score",
    ):  # fmt: skip
        assert family in used, family


def test_the_running_sidecar_exports_its_alert_sink(running_sidecar: RunningSidecar) -> None:
    """Alerting is really on: the sink's own labelled series exist, not only the families' HELP lines."""
    samples = {
        (s.name, tuple(sorted(s.labels.items())))
        for family in text_string_to_metric_families(running_sidecar.metrics())
        for s in family.samples
    }
    assert ("sidecar_alert_sink_up", (("sink", "kafka"),)) in samples
    assert ("sidecar_alerts_pending", ()) in samples
