"""The fleet dashboard shows live alert precision from people's feedback, with the counts behind it."""

from __future__ import annotations

import json

from tests.deploy.chart import CHART
from tests.deploy.promql import metric_names


def test_alert_precision_panel_and_its_counts() -> None:
    dashboard = json.loads((CHART / "dashboards" / "fleet-overview.json").read_text())
    by_title = {p["title"]: p for p in dashboard["panels"]}
    precision = by_title["Alert precision from feedback (1 d)"]
    counts = by_title["Alerts judged by people (1 d)"]
    expr = precision["targets"][0]["expr"]
    assert metric_names(expr) == {"sidecar_alert_feedback_total"}
    numerator, denominator = expr.split(" / ")
    assert 'verdict="true_alarm"' in numerator and "verdict" not in denominator
    assert "by (agent, kind)" in numerator and "by (agent, kind)" in denominator
    assert precision["fieldConfig"]["defaults"]["unit"] == "percentunit"
    assert "by (agent, kind, verdict)" in counts["targets"][0]["expr"]
    assert precision["gridPos"]["y"] == counts["gridPos"]["y"]  # side by side: the ratio and its counts
