"""The Grafana dashboards: valid against Grafana's own schemas, consistent, and shipped verbatim.

Schemas: tests/deploy/grafana-schema/ (vendored from grafana/grafana-foundation-sdk, see its
README). That every metric a panel queries is exported is proven against a running sidecar in
test_metric_names.py.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from tests.deploy.chart import CHART, render, run_helm, template_args
from tests.deploy.kube import validation_errors
from tests.deploy.promql import metric_names

DASHBOARDS = sorted((CHART / "dashboards").glob("*.json"))
SCHEMAS = Path(__file__).resolve().parent / "grafana-schema"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}


@cache
def schema(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((SCHEMAS / f"{name}.jsonschema.json").read_text())
    return loaded


def validator(name: str, definition: str) -> jsonschema.Draft7Validator:
    """A validator for one definition of a vendored schema file."""
    root = {**schema(name), "$ref": f"#/definitions/{definition}"}
    return jsonschema.Draft7Validator(root)


def load(path: Path) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(path.read_text())
    return loaded


def panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel that is not a row, rows' nested panels included."""
    for p in dashboard["panels"]:
        if p["type"] == "row":
            yield from p.get("panels", [])
        else:
            yield p


def errors(v: jsonschema.Draft7Validator, instance: object) -> list[str]:
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message[:300]}" for e in v.iter_errors(instance)]


def test_there_are_three_dashboards() -> None:
    assert [p.name for p in DASHBOARDS] == ["fleet-overview.json", "pipeline-health.json", "vllm.json"]


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.stem)
def test_dashboard_matches_grafana_schema(path: Path) -> None:
    dashboard = load(path)
    assert errors(validator("dashboard", "Dashboard"), dashboard) == []


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.stem)
def test_panel_options_and_queries_match_their_schemas(path: Path) -> None:
    problems = []
    for p in panels(load(path)):
        title = p.get("title")
        kind = p["type"]
        if not (SCHEMAS / f"{kind}.jsonschema.json").is_file():
            problems.append(f"{title}: no vendored schema for panel type {kind}")
            continue
        problems += [f"{title} options {e}" for e in errors(validator(kind, "Options"), p.get("options", {}))]
        custom = p.get("fieldConfig", {}).get("defaults", {}).get("custom")
        if custom is not None:
            problems += [f"{title} custom {e}" for e in errors(validator(kind, "FieldConfig"), custom)]
        for t in p.get("targets", []):
            problems += [f"{title} target {e}" for e in errors(validator("prometheus", "Dataquery"), t)]
    assert problems == []


def test_the_schemas_catch_mistakes() -> None:
    """The validation above is not vacuous: typical slips are refused."""
    good = load(DASHBOARDS[0])
    bad = json.loads(json.dumps(good))
    bad["panels"][1]["gridPos"]["width"] = 12
    assert errors(validator("dashboard", "Dashboard"), bad)
    target = dict(next(panels(good))["targets"][0])
    target["exprr"] = target.pop("expr")
    assert errors(validator("prometheus", "Dataquery"), target)
    assert errors(validator("timeseries", "Options"), {"legend": {"displayMode": "list"}})


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.stem)
def test_layout_ids_and_datasources(path: Path) -> None:
    dashboard = load(path)
    ids = [p["id"] for p in dashboard["panels"]] + [q["id"] for r in dashboard["panels"] for q in r.get("panels", [])]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for p in dashboard["panels"]:
        g = p["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24, p["title"]
    for p in panels(dashboard):
        assert p["datasource"] == DATASOURCE, p["title"]
        assert p.get("description"), f"{p['title']}: every panel says what it shows"
        assert p["targets"], p["title"]
        for t in p["targets"]:
            assert t["datasource"] == DATASOURCE, p["title"]
            assert t["expr"].strip(), p["title"]


def test_uids_are_unique_and_stable() -> None:
    uids = [load(p)["uid"] for p in DASHBOARDS]
    assert uids == ["llm-agent-sidecar-fleet", "llm-agent-sidecar-pipeline", "llm-agent-sidecar-vllm"]


def variables(path: Path) -> dict[str, dict[str, Any]]:
    return {v["name"]: v for v in load(path)["templating"]["list"]}


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.stem)
def test_datasource_is_a_variable(path: Path) -> None:
    ds = variables(path)["datasource"]
    assert ds["type"] == "datasource"
    assert ds["query"] == "prometheus"


SCOPED = re.compile(r"(sidecar_\w+|process_\w+|vllm:\w+)(\{[^}]*\})?")
# Label lists of aggregations: an Enum's label has its metric's name (sidecar_vllm_mixed_batches_mode).
GROUPING = re.compile(r"\b(?:by|without)\s*\([^)]*\)")


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.stem)
def test_every_query_is_scoped_to_a_cluster_and_namespace(path: Path) -> None:
    """Same-named releases in two namespaces (or clusters) must not merge on a panel."""
    v = variables(path)
    names = list(v)
    assert names.index("cluster") < names.index("namespace") < names.index("job")
    assert v["cluster"]["allValue"] == ".*", "All must match series without a cluster label"
    assert 'cluster=~"$cluster"' in v["namespace"]["query"]
    assert 'namespace=~"$namespace"' in v["job"]["query"]
    exprs = [t["expr"] for p in panels(load(path)) for t in p["targets"]]
    # every query but those of the two scope variables themselves
    exprs += [q["query"] for q in v.values() if q["type"] == "query" and q["name"] not in ("cluster", "namespace")]
    for expr in exprs:
        for m in SCOPED.finditer(GROUPING.sub("", expr)):
            selector = m.group(2) or ""
            assert 'cluster=~"$cluster"' in selector and 'namespace=~"$namespace"' in selector, m.group(0)


ALERT_PARAM = re.compile(r"prometheusRule\.alerts\.(\w+)\.(\w+)")


def test_alert_thresholds_are_drawn_at_the_default_values() -> None:
    """A panel that names an alert's threshold parameter draws it as a line, at its default."""
    values = yaml.safe_load((CHART / "values.yaml").read_text())["prometheusRule"]["alerts"]
    drawn = []
    for path in DASHBOARDS:
        for p in panels(load(path)):
            m = ALERT_PARAM.search(p["description"])
            if not m:
                continue
            defaults = p["fieldConfig"]["defaults"]
            assert defaults["custom"]["thresholdsStyle"]["mode"].startswith("line"), p["title"]
            steps = defaults["thresholds"]["steps"]
            assert steps[-1]["value"] == values[m.group(1)][m.group(2)], p["title"]
            drawn.append(m.group(1))
    assert {"SidecarCommitStalled", "SidecarScoringBacklog"} <= set(drawn)


def test_fleet_overview_filters_by_agent_and_goal() -> None:
    path = CHART / "dashboards" / "fleet-overview.json"
    v = variables(path)
    for name in ("agent", "goal"):
        assert v[name]["type"] == "query"
        assert v[name]["includeAll"] is True
    exprs = [t["expr"] for p in panels(load(path)) for t in p["targets"]]
    assert any('goal=~"$goal"' in e for e in exprs)
    assert all('agent=~"$agent"' in e for e in exprs if "sidecar_conversations_ended_total" in e)


def test_goal_names_come_from_the_info_metric_by_a_join_on_goal() -> None:
    """Goal labels are stable ids; the names join in from sidecar_goal_info, and a goal without a
    published name still shows (by its id)."""
    path = CHART / "dashboards" / "fleet-overview.json"
    joined = [t for p in panels(load(path)) for t in p["targets"] if "sidecar_goal_info" in t["expr"]]
    assert len(joined) >= 2
    for t in joined:
        assert "on (goal) group_left (name)" in t["expr"]
        assert "or on (goal)" in t["expr"]
        assert "{{name}}" in t["legendFormat"]


def test_vllm_dashboard_reads_prefix_cache_hits_from_vllm_itself() -> None:
    exprs = [t["expr"] for p in panels(load(CHART / "dashboards" / "vllm.json")) for t in p["targets"]]
    names = set().union(*(metric_names(e) for e in exprs))
    assert {"vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total"} <= names


def test_dashboards_are_shipped_verbatim_as_labelled_configmaps() -> None:
    docs = render(set_values={"dashboards.enabled": "true"})
    maps = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ConfigMap" and "dashboard" in d["metadata"]["name"]}
    assert len(maps) == len(DASHBOARDS)
    shipped = {}
    for cm in maps.values():
        assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
        shipped.update(cm["data"])
    assert shipped == {p.name: p.read_text().rstrip("\n") for p in DASHBOARDS}
    # The template never embeds dashboard JSON: it reads the files.
    template = (CHART / "templates" / "dashboards.yaml").read_text()
    assert ".Files.Get" in template
    assert '"panels"' not in template


def grafana_dashboards(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == "GrafanaDashboard"}


def test_grafana_operator_dashboards_carry_the_files_inline() -> None:
    docs = render(set_values={"dashboards.grafanaOperator.enabled": "true"})
    found = grafana_dashboards(docs)
    assert len(found) == len(DASHBOARDS)
    # Without dashboards.enabled no ConfigMap duplicates them for Grafana's sidecar.
    assert not [d for d in docs if d["kind"] == "ConfigMap" and "-dashboard-" in d["metadata"]["name"]]
    shipped = {}
    for d in found.values():
        assert validation_errors(d) == []
        spec = d["spec"]
        assert spec["instanceSelector"] == {"matchLabels": {"dashboards": "grafana"}}
        assert spec["folder"] == "LLM agent sidecar"
        assert spec["allowCrossNamespaceImport"] is False
        assert "configMapRef" not in spec
        shipped[json.loads(spec["json"])["uid"]] = spec["json"]
    assert shipped == {load(p)["uid"]: p.read_text().rstrip("\n") for p in DASHBOARDS}


def test_grafana_operator_dashboards_can_read_the_configmaps() -> None:
    docs = render(
        set_values={
            "dashboards.enabled": "true",
            "dashboards.namespace": "monitoring",
            "dashboards.grafanaOperator.enabled": "true",
            "dashboards.grafanaOperator.source": "configMap",
            "dashboards.grafanaOperator.folder": "",
        }
    )
    maps = {
        (d["metadata"]["namespace"], d["metadata"]["name"]): d
        for d in docs
        if d["kind"] == "ConfigMap" and "-dashboard-" in d["metadata"]["name"]
    }
    found = grafana_dashboards(docs)
    assert len(found) == len(DASHBOARDS) == len(maps)
    for d in found.values():
        assert validation_errors(d) == []
        spec = d["spec"]
        assert "json" not in spec and "folder" not in spec
        # A configMapRef has no namespace: the ConfigMap must sit next to the GrafanaDashboard.
        ref = spec["configMapRef"]
        cm = maps[(d["metadata"]["namespace"], ref["name"])]
        assert json.loads(cm["data"][ref["key"]])["uid"]


def test_grafana_operator_configmap_source_needs_the_configmaps(helm: str) -> None:
    proc = run_helm(
        *template_args(
            set_values={"dashboards.grafanaOperator.enabled": "true", "dashboards.grafanaOperator.source": "configMap"}
        ),
        check=False,
    )
    assert proc.returncode != 0
    assert "set dashboards.enabled=true too" in proc.stderr


def test_the_crd_schema_catches_grafana_dashboard_mistakes() -> None:
    docs = render(set_values={"dashboards.grafanaOperator.enabled": "true"})
    good = next(iter(grafana_dashboards(docs).values()))
    assert validation_errors(good) == []
    for bad_spec in (
        {k: v for k, v in good["spec"].items() if k != "instanceSelector"},  # required by the CRD
        {**good["spec"], "folders": "x"},
        {**good["spec"], "resyncPeriod": "1d"},
        {**good["spec"], "configMapRef": {"name": "x"}},  # no key
    ):
        assert validation_errors({**good, "spec": bad_spec}), bad_spec
