"""values.yaml and values.schema.json: every value documented, every object closed, bad values
refused by helm itself before anything renders."""

from __future__ import annotations

import json
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from tests.deploy import values_schema
from tests.deploy.chart import CHART, run_helm, template_args
from tests.deploy.render import params

SCHEMA = values_schema.SCHEMA_PATH
OPEN_OBJECTS = {
    # Helm hands a parent chart's global values down to its subcharts: refusing unknown keys
    # there would make the chart unusable as a dependency.
    "properties/global",
    # Kubernetes' own free-form type: managedFields entries, written by the API server (reachable
    # only through an ephemeral volume's claim template metadata).
    "definitions/io.k8s.apimachinery.pkg.apis.meta.v1.FieldsV1",
}
# Conditions (if/then) constrain values described elsewhere; they describe no object themselves.
CONDITIONS = "allOf/"


@cache
def schema() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(SCHEMA.read_text())
    return loaded


def values() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((CHART / "values.yaml").read_text())
    return loaded


def object_nodes(node: Any, path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    if isinstance(node, dict):
        if (
            node.get("type") == "object"
            or (isinstance(node.get("type"), list) and "object" in node["type"])
            or ("properties" in node)
        ):
            yield path, node
        for k, v in node.items():
            yield from object_nodes(v, f"{path}/{k}".lstrip("/"))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from object_nodes(v, f"{path}/{i}")


def test_schema_is_draft_07() -> None:
    s = schema()
    assert s["$schema"] == "http://json-schema.org/draft-07/schema#"
    jsonschema.Draft7Validator.check_schema(s)


def test_every_object_is_closed() -> None:
    """additionalProperties: false on every object with properties; maps constrain their values."""
    open_ = []
    for path, node in object_nodes(schema()):
        if path in OPEN_OBJECTS or path.startswith(CONDITIONS):
            continue
        extra = node.get("additionalProperties")
        if "properties" in node and extra is not False:
            open_.append(path)
        elif "properties" not in node and not isinstance(extra, dict) and extra is not False:
            open_.append(path)  # a map must say what its values are
    assert open_ == []


def test_generated_definitions_are_current() -> None:
    """The config tree's schema follows sidecar.config; regenerate after changing the config."""
    assert values_schema.main(["--check"]) == 0, "run .venv/bin/python -m tests.deploy.values_schema"


def test_defaults_match_the_schema() -> None:
    errors = [e.message for e in jsonschema.Draft7Validator(schema()).iter_errors(values())]
    assert errors == []


def leaf_paths(node: Any, prefix: str = "") -> Iterator[str]:
    if isinstance(node, dict) and node:
        for k, v in node.items():
            yield from leaf_paths(v, f"{prefix}.{k}" if prefix else k)
    else:
        yield prefix


def schema_at(path: str) -> dict[str, Any]:
    s = schema()
    node: dict[str, Any] = s
    for part in path.split("."):
        node = node["properties"][part]
    return node


def free_form(path: str) -> bool:
    """A value documented as a whole: a pass-through Kubernetes object, the config tree, or a map."""
    node = schema_at(path)
    return "$ref" in node or node.get("type") == "array" or isinstance(node.get("additionalProperties"), dict)


def test_every_value_is_documented() -> None:
    documented = {p.key for p in params()}
    missing = []
    for leaf in leaf_paths(values()):
        parts = leaf.split(".")
        ancestors = [".".join(parts[:i]) for i in range(1, len(parts))]
        if leaf in documented or any(a in documented and free_form(a) for a in ancestors):
            continue
        missing.append(leaf)
    assert missing == []


def test_every_documented_value_exists_and_has_a_schema() -> None:
    v = values()
    for p in params():
        node: Any = v
        for part in p.key.split("."):
            assert isinstance(node, dict) and part in node, f"@param {p.key} is not in values.yaml"
            node = node[part]
        schema_at(p.key)
        assert p.description and p.section, p.key
    keys = [p.key for p in params()]
    assert len(keys) == len(set(keys))


def test_secret_fields_are_refused_in_config() -> None:
    paths = values_schema.secret_config_paths()
    assert {"kafka.sasl_password", "kafka.journal_signing_keys", "scoring.vllm.api_key"} <= set(paths)


# Bad values, and a piece of helm's message for each. Helm validates against values.schema.json
# before rendering, so none of these reaches a template.
BAD_VALUES: list[tuple[str, dict[str, Any], str]] = [
    ("unknown top-level key", {"replicas": 3}, "Additional property replicas is not allowed"),
    (
        "typo in the sidecar config",
        {"config": {"kafka": {"bootstrap_server": "k:9092"}}},
        "Additional property bootstrap_server is not allowed",
    ),
    ("unknown config section", {"config": {"scorer": {"enabled": True}}}, "Additional property scorer is not allowed"),
    (
        "secret in the ConfigMap",
        {"config": {"kafka": {"sasl_password": "hunter2"}}},
        "Additional property sasl_password is not allowed",
    ),
    ("config value out of range", {"config": {"kafka": {"fetch_max_records": 0}}}, "fetch_max_records"),
    ("config enum", {"config": {"logging": {"format": "xml"}}}, "format"),
    ("wrong type", {"replicaCount": "two"}, "replicaCount: Invalid type"),
    ("unknown mode", {"mode": "sidecar"}, "mode"),
    ("in-pod without a pod selector", {"mode": "inPod"}, "podSelector"),
    ("malformed digest", {"image": {"digest": "latest"}}, "digest"),
    ("duration", {"prometheusRule": {"alerts": {"SidecarDeadLetterRateHigh": {"for": "10 minutes"}}}}, "for"),
    (
        "unknown alert",
        {"prometheusRule": {"alerts": {"SidecarOnFire": {"enabled": True}}}},
        "Additional property SidecarOnFire is not allowed",
    ),
    ("severity", {"prometheusRule": {"alerts": {"SidecarCommitStalled": {"severity": "page"}}}}, "severity"),
    (
        "typo inside a Kubernetes toleration",
        {"tolerations": [{"key": "gpu", "operatr": "Exists"}]},
        "Additional property operatr is not allowed",
    ),
    (
        "typo inside a Kubernetes volume",
        {"extraVolumes": [{"name": "v", "emptydir": {}}]},
        "Additional property emptydir is not allowed",
    ),
    ("secret variable name", {"secrets": {"extraEnv": {"PASSWORD": "x"}}}, "PASSWORD"),
    ("GPU memory share", {"vllm": {"gpuMemoryUtilization": 1.5}}, "gpuMemoryUtilization"),
    ("adapter path", {"vllm": {"adapters": {"modules": {"completion": "/etc/passwd"}}}}, "completion"),
    (
        "relabeling typo",
        {"serviceMonitor": {"relabelings": [{"sourceLabel": ["a"]}]}},
        "Additional property sourceLabel is not allowed",
    ),
    ("dashboard labels must be strings", {"dashboards": {"labels": {"grafana_dashboard": 1}}}, "grafana_dashboard"),
    ("dashboard source", {"dashboards": {"grafanaOperator": {"source": "url"}}}, "source"),
    (
        "empty Grafana instance selector",
        {"dashboards": {"grafanaOperator": {"instanceSelector": {"matchLabels": None}}}},
        "instanceSelector",
    ),
    (
        "typo in the Grafana instance selector",
        {"dashboards": {"grafanaOperator": {"instanceSelector": {"matchLabel": {"a": "b"}}}}},
        "Additional property matchLabel is not allowed",
    ),
    ("Go duration", {"dashboards": {"grafanaOperator": {"resyncPeriod": "1d"}}}, "resyncPeriod"),
    ("pod port name", {"podMonitor": {"port": "9108; rm -rf /"}}, "port"),
    ("pod port name length", {"podMonitor": {"port": "a" * 16}}, "port"),
    ("pod selector values", {"podMonitor": {"podSelector": {"app": ["a", "b"]}}}, "app"),
    ("pod monitor interval", {"podMonitor": {"interval": "often"}}, "interval"),
    (
        "pod monitor relabeling typo",
        {"podMonitor": {"relabelings": [{"target_label": "x"}]}},
        "Additional property target_label is not allowed",
    ),
    # prometheusRule.seriesSelector goes into every selector of the rules: matchers on namespace and
    # job only, in double quotes, without braces, newlines or backslashes.
    ("series selector in braces", {"prometheusRule": {"seriesSelector": '{namespace="agents"}'}}, "seriesSelector"),
    (
        "series selector closing the selector",
        {"prometheusRule": {"seriesSelector": 'job="a"}) or vector(1) or (up{job="b"'}},
        "seriesSelector",
    ),
    ("series selector brace in a value", {"prometheusRule": {"seriesSelector": 'job="a}"'}}, "seriesSelector"),
    ("series selector newline", {"prometheusRule": {"seriesSelector": 'namespace="a",\njob="b"'}}, "seriesSelector"),
    ("series selector other label", {"prometheusRule": {"seriesSelector": 'instance="a:9108"'}}, "seriesSelector"),
    ("series selector unquoted", {"prometheusRule": {"seriesSelector": "job=shop"}}, "seriesSelector"),
    (
        "series selector empty matcher",
        {"prometheusRule": {"seriesSelector": 'job="a",, namespace="b"'}},
        "seriesSelector",
    ),
    ("series selector escape", {"prometheusRule": {"seriesSelector": 'job="a\\"'}}, "seriesSelector"),
    ("series selector length", {"prometheusRule": {"seriesSelector": 'job=~"' + "a" * 500 + '"'}}, "seriesSelector"),
]


@pytest.mark.parametrize(("values_", "message"), [b[1:] for b in BAD_VALUES], ids=[b[0] for b in BAD_VALUES])
def test_bad_values_are_refused(helm: str, tmp_path: Path, values_: dict[str, Any], message: str) -> None:
    path = tmp_path / "bad-values.yaml"
    path.write_text(yaml.safe_dump(values_))
    proc = run_helm(*template_args([path]), check=False)
    assert proc.returncode != 0, "helm accepted bad values"
    assert "values don't meet the specifications of the schema" in proc.stderr, proc.stderr
    assert message in proc.stderr, proc.stderr
