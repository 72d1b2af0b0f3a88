"""The alert rules: promtool accepts them, a promtool unit test fires each one, and each has its
runbook. deploy/prometheus/sidecar-alerts.yaml is the chart's PrometheusRule with the default
thresholds (the drift test keeps it so)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from sidecar.alerting.config import UncertaintyPolicyConfig
from tests.deploy.chart import DEPLOY, ToolMissing, one, render, rule_groups, scenarios, tool
from tests.deploy.promql import selectors

RULES = DEPLOY / "prometheus" / "sidecar-alerts.yaml"
UNIT_TESTS = sorted(Path(__file__).resolve().parent.glob("rules-test*.yaml"))
RUNBOOKS = DEPLOY / "runbooks"
SECTIONS = ("## Meaning", "## Impact", "## Diagnosis", "## Mitigation")
RUNBOOK_BASE = "https://github.com/llm-agent-sidecar/llm-agent-sidecar/blob/main/deploy/runbooks"


@pytest.fixture(scope="module")
def promtool() -> str:
    try:
        return tool("promtool")
    except ToolMissing as exc:
        pytest.fail(str(exc))


def promtool_run(binary: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([binary, *args], capture_output=True, text=True, check=False, timeout=120)


def rules() -> list[dict[str, Any]]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [r for g in groups for r in g["rules"]]


def alerts() -> list[dict[str, Any]]:
    return [r for r in rules() if "alert" in r]


def recordings() -> list[dict[str, Any]]:
    return [r for r in rules() if "record" in r]


def test_promtool_check_rules(promtool: str) -> None:
    proc = promtool_run(promtool, "check", "rules", "--lint-fatal", str(RULES))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"SUCCESS: {len(rules())} rules found" in proc.stdout


@pytest.mark.parametrize("path", [p for p in scenarios() if "prometheusRule" in p.read_text()], ids=lambda p: p.stem)
def test_promtool_check_rules_of_each_scenario(promtool: str, helm: str, path: Path, tmp_path: Path) -> None:
    groups = rule_groups(render([path]))
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump({"groups": groups}))
    # --lint-fatal: promtool only warns about duplicate rules (same name and labels) otherwise.
    proc = promtool_run(promtool, "check", "rules", "--lint-fatal", str(rules))
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_promtool_unit_tests(promtool: str) -> None:
    proc = promtool_run(promtool, "test", "rules", *map(str, UNIT_TESTS))
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_every_alert_has_a_firing_unit_test() -> None:
    cases = [c for path in UNIT_TESTS for c in yaml.safe_load(path.read_text())["tests"]]
    fired = {t["alertname"] for c in cases for t in c.get("alert_rule_test", []) if t.get("exp_alerts")}
    quiet = {t["alertname"] for c in cases for t in c.get("alert_rule_test", []) if not t.get("exp_alerts")}
    names = {a["alert"] for a in alerts()}
    assert names - fired == set(), "alerts never shown firing"
    # Each firing case also lists every alert expected at that time, so look-alike series in the
    # same test are proven quiet; an explicit quiet case shows the `for` duration or a threshold.
    assert names - quiet == set(), "alerts never shown quiet"


def test_alerts_follow_the_conventions() -> None:
    names = [a["alert"] for a in alerts()]
    assert names == [
        "SidecarCompletionRateDropping", "SidecarUncertainTurnsSpike", "SidecarConsumerLagGrowing",
        "SidecarCommitStalled", "SidecarCommitsFailing", "SidecarDeadLetterRateHigh", "SidecarLlmErrorRateHigh",
        "SidecarDown", "SidecarLlmCircuitBreakerOpen", "SidecarScoringBacklog", "SidecarEscalationLatencyHigh",
        "SidecarAlertSinkDown", "SidecarAlertsRejected", "SidecarUncertainTurnRateAboveTarget",
        "SidecarAdapterDrift",
    ]  # fmt: skip
    for a in alerts():
        assert re.fullmatch(r"[A-Z][a-z0-9]+(?:[A-Z][a-z0-9]+)+", a["alert"]), a["alert"]
        assert a["labels"]["severity"] in {"critical", "warning", "info"}
        assert set(a["annotations"]) == {"summary", "description", "runbook_url"}
        assert a["annotations"]["runbook_url"] == f"{RUNBOOK_BASE}/{a['alert']}.md"
        assert a["for"]


# A recorded series' name: level (the labels it keeps), metric, operations (Prometheus's
# recording-rule naming conventions).
RECORD_NAME = re.compile(r"(?P<level>[a-z]+(?:_[a-z]+)*):(?P<metric>sidecar_[a-z_]+):(?P<ops>[a-z0-9_]+)")


def test_day_long_baselines_are_recorded_and_read_by_the_alerts() -> None:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    baselines = next(g for g in groups if g["name"] == "llm-agent-sidecar.baselines")
    assert baselines["interval"] == "2m"
    assert all("record" in r for r in baselines["rules"])
    names = [r["record"] for r in recordings()]
    assert names == [
        "namespace_job_agent:sidecar_conversations_completed:ratio_rate1d",
        "namespace_job_agent:sidecar_uncertain_turns_per_tree:ratio_rate1d",
    ]
    for r in recordings():
        m = RECORD_NAME.fullmatch(r["record"])
        assert m, r["record"]
        # The level names exactly the labels the expression keeps.
        assert f"sum by ({', '.join(m['level'].split('_'))})" in r["expr"]
        assert m["ops"] == "ratio_rate1d" and "[1d]" in r["expr"]
    by_name = {a["alert"]: a["expr"] for a in alerts()}
    # The alerts read the recorded series as they were one window ago, and no day-long range.
    assert f"{names[0]} offset 1h" in by_name["SidecarCompletionRateDropping"]
    assert f"{names[1]} offset 15m" in by_name["SidecarUncertainTurnsSpike"]
    for a in alerts():
        assert "[1d]" not in a["expr"], a["alert"]


def test_baselines_follow_the_alerts_values(helm: str) -> None:
    a = "prometheusRule.alerts"
    groups = rule_groups(
        render(
            set_values={
                "prometheusRule.enabled": "true",
                "prometheusRule.recordingRules.interval": "1m",
                f"{a}.SidecarCompletionRateDropping.baselineWindow": "7d",
                f"{a}.SidecarUncertainTurnsSpike.enabled": "false",
            }
        )
    )
    (baselines,) = [g for g in groups if g["name"] == "llm-agent-sidecar.baselines"]
    assert baselines["interval"] == "1m"
    (record,) = baselines["rules"]
    assert record["record"] == "namespace_job_agent:sidecar_conversations_completed:ratio_rate7d"
    assert "[7d]" in record["expr"]
    (alert,) = [r for g in groups for r in g["rules"] if r.get("alert") == "SidecarCompletionRateDropping"]
    assert "namespace_job_agent:sidecar_conversations_completed:ratio_rate7d offset 1h" in alert["expr"]
    # Without the two alerts, nothing is recorded.
    groups = rule_groups(
        render(
            set_values={
                "prometheusRule.enabled": "true",
                f"{a}.SidecarCompletionRateDropping.enabled": "false",
                f"{a}.SidecarUncertainTurnsSpike.enabled": "false",
            }
        )
    )
    assert [g["name"] for g in groups] == ["llm-agent-sidecar"]


def test_every_alert_can_be_tuned_from_values(helm: str) -> None:
    values = yaml.safe_load((DEPLOY.parent / "helm" / "sidecar" / "values.yaml").read_text())
    assert list(values["prometheusRule"]["alerts"]) == [a["alert"] for a in alerts()]
    rule = one(
        render(
            set_values={"prometheusRule.enabled": "true", "prometheusRule.alerts.SidecarCommitStalled.enabled": "false"}
        ),
        "PrometheusRule",
    )
    names = [r["alert"] for g in rule["spec"]["groups"] for r in g["rules"] if "alert" in r]
    assert "SidecarCommitStalled" not in names and len(names) == len(alerts()) - 1


def test_every_alert_has_a_runbook() -> None:
    index = (RUNBOOKS / "README.md").read_text()
    pages = {p.stem for p in RUNBOOKS.glob("*.md")} - {"README"}
    assert pages == {a["alert"] for a in alerts()}
    for a in alerts():
        text = (RUNBOOKS / f"{a['alert']}.md").read_text()
        assert text.startswith(f"# {a['alert']}\n")
        positions = [text.find(s + "\n") for s in SECTIONS]
        assert all(p > 0 for p in positions) and positions == sorted(positions), a["alert"]
        assert f"[{a['alert']}.md]({a['alert']}.md)" in index


def target_rules(groups: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for g in groups for r in g["rules"] if r.get("alert") == "SidecarUncertainTurnRateAboveTarget"]


def threshold(rule: dict[str, Any]) -> str:
    """The target rate in the rule's ``> factor * target`` comparison."""
    m = re.search(r"^> 3 \* ([0-9.]+)$", rule["expr"], re.MULTILINE)
    assert m, rule["expr"]
    return m.group(1)


def test_uncertain_turn_rate_alert_reads_the_policy_targets(helm: str, tmp_path: Path) -> None:
    """One rule per uncertainty policy, with that policy's target_rate: the default policy's for the
    agents without their own, each listed agent's own (or the sidecar's default, as an agent's policy
    replaces the default policy whole)."""
    default_target = str(UncertaintyPolicyConfig.model_fields["target_rate"].default)
    [rule] = target_rules(rule_groups(render(set_values={"prometheusRule.enabled": "true"})))
    assert threshold(rule) == default_target
    assert "{" not in rule["expr"]
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump({
        "prometheusRule": {"enabled": True},
        "config": {"alerting": {
            "policy": {"uncertainty": {"target_rate": 0.1}},
            "agents": {"support": {"max_alerts_per_minute": 5}, "booking": {"uncertainty": {"target_rate": 0.02}}},
        }},
    }))  # fmt: skip
    rules = target_rules(rule_groups(render([values])))
    assert [r["expr"].count('{agent!="booking", agent!="support"}') for r in rules] == [3, 0, 0]
    assert [r["expr"].count('{agent="booking"}') for r in rules] == [0, 3, 0]
    assert [r["expr"].count('{agent="support"}') for r in rules] == [0, 0, 3]
    assert [threshold(r) for r in rules] == ["0.1", "0.02", default_target]
    for r in rules:
        assert f"the target rate {threshold(r)} of its uncertainty policy" in r["annotations"]["description"]


def test_the_spike_alert_leaves_relative_policy_agents_to_the_target_alert(helm: str) -> None:
    def spike(extra: dict[str, str]) -> str:
        groups = rule_groups(render(set_values={"prometheusRule.enabled": "true", **extra}))
        expr: str = next(
            r["expr"] for g in groups for r in g["rules"] if r.get("alert") == "SidecarUncertainTurnsSpike"
        )
        return expr

    assert "unless on (namespace, job, agent)" in spike({})
    off = {"prometheusRule.alerts.SidecarUncertainTurnRateAboveTarget.enabled": "false"}
    assert "sidecar_uncertainty_score_count" not in spike(off)


# prometheusRule.seriesSelector: one release's rules among others in the same Prometheus.
SCOPED_UNIT_TESTS = Path(__file__).resolve().parent / "scoped-rules-test.yaml"
SHOP = 'namespace="agents", job="shop-sidecar"'
Matchers = frozenset[tuple[str, str, str]]


def unscoped(expr: str, scope: Matchers) -> list[str]:
    """The metric selectors of an expression that lack one of the scope's matchers."""
    return [name for name, matchers in selectors(expr) if not scope <= matchers]


def test_the_scope_check_finds_a_selector_without_the_matchers() -> None:
    scope = frozenset({("namespace", "=", '"agents"'), ("job", "=~", '"shop-.*"')})
    scoped = '{outcome="complete", namespace="agents", job=~"shop-.*"}'
    assert unscoped(f"sum by (job) (rate(a{scoped}[5m])) / b:c:d{scoped} offset 1h", scope) == []
    assert unscoped(f"sum by (job) (rate(a{scoped}[5m])) / b:c:d offset 1h", scope) == ["b:c:d"]
    assert unscoped(f'a{scoped} - b{{namespace="agents", job="shop-.*"}}', scope) == ["b"]
    assert unscoped(f"histogram_quantile(0.9, rate(x_bucket{{namespace='agents'}}[5m])) and y{scoped}", scope) == [
        "x_bucket"
    ]
    with pytest.raises(ValueError, match="unreadable"):
        selectors('a{job="x"; namespace="y"}')


def scoped_values(tmp_path: Path, selector: str) -> Path:
    """Values with the rules on, per-agent uncertainty policies (selectors with matchers of their
    own) and the series selector."""
    path = tmp_path / "scoped-values.yaml"
    path.write_text(yaml.safe_dump({
        "prometheusRule": {"enabled": True, "seriesSelector": selector},
        "config": {"alerting": {"agents": {"booking": {"uncertainty": {"target_rate": 0.02}}}}},
    }))  # fmt: skip
    return path


@pytest.mark.parametrize(
    ("selector", "scope"),
    [
        (SHOP, {("namespace", "=", '"agents"'), ("job", "=", '"shop-sidecar"')}),
        (
            ' job=~"shop-.*|travel" ,namespace!="staging" ',
            {("job", "=~", '"shop-.*|travel"'), ("namespace", "!=", '"staging"')},
        ),
    ],
    ids=["equal", "regex"],
)  # fmt: skip
def test_the_series_selector_scopes_every_selector_of_every_rule(
    promtool: str, helm: str, tmp_path: Path, selector: str, scope: set[tuple[str, str, str]]
) -> None:
    """Every metric selector of every rule, alerts and recordings, carries the matchers, next to
    its own; SidecarDown, with matchers of its own, is left as it is."""
    default = [r for g in rule_groups(render([scoped_values(tmp_path, "")])) for r in g["rules"]]
    groups = rule_groups(render([scoped_values(tmp_path, selector)]))
    scoped = [r for g in groups for r in g["rules"]]
    assert [r.get("alert", r.get("record")) for r in scoped] == [r.get("alert", r.get("record")) for r in default]
    assert len(scoped) == len(alerts()) + 2 + 1  # a second SidecarUncertainTurnRateAboveTarget, for booking
    for before, after in zip(default, scoped, strict=True):
        name = after.get("alert", after.get("record"))
        if name == "SidecarDown":
            assert after["expr"] == before["expr"]
            assert unscoped(after["expr"], frozenset(scope)) == ["up", "up"]
            continue
        assert selectors(after["expr"]), name
        assert unscoped(after["expr"], frozenset(scope)) == [], name
        # The selectors' own matchers are kept: take the scope away and the default rule is left.
        assert [(n, m - scope) for n, m in selectors(after["expr"])] == selectors(before["expr"]), name
    rules = tmp_path / "scoped-alerts.yaml"
    rules.write_text(yaml.safe_dump({"groups": groups}))
    proc = promtool_run(promtool, "check", "rules", "--lint-fatal", str(rules))
    assert proc.returncode == 0, proc.stdout + proc.stderr


def run_scoped_unit_tests(promtool: str, tmp_path: Path, selector: str) -> subprocess.CompletedProcess[str]:
    """promtool test rules on scoped-rules-test.yaml, the chart rendered with the selector and
    without annotations."""
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump({"prometheusRule": {"enabled": True, "seriesSelector": selector}}))
    groups = rule_groups(render([values]))
    for g in groups:
        for r in g["rules"]:
            r.pop("annotations", None)
    (tmp_path / "scoped-alerts.yaml").write_text(yaml.safe_dump({"groups": groups}))
    shutil.copy(SCOPED_UNIT_TESTS, tmp_path / SCOPED_UNIT_TESTS.name)
    return promtool_run(promtool, "test", "rules", str(tmp_path / SCOPED_UNIT_TESTS.name))


def test_a_scoped_release_alerts_on_its_own_sidecars_only(promtool: str, helm: str, tmp_path: Path) -> None:
    proc = run_scoped_unit_tests(promtool, tmp_path, SHOP)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_without_the_selector_the_rules_alert_on_every_release(promtool: str, helm: str, tmp_path: Path) -> None:
    """The same cases fail with the default render: each alert fires for the other two sidecars too."""
    proc = run_scoped_unit_tests(promtool, tmp_path, "")
    assert proc.returncode != 0
    for name in ("SidecarConsumerLagGrowing", "SidecarCommitsFailing", "SidecarCommitStalled", "SidecarAlertsRejected",
                 "SidecarCompletionRateDropping"):  # fmt: skip
        assert f"alertname: {name}" in proc.stdout + proc.stderr, name
    assert "travel-sidecar" in proc.stdout + proc.stderr and "staging" in proc.stdout + proc.stderr
