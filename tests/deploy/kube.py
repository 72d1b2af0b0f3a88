"""Offline validation of rendered manifests.

Built-in kinds go through kubernetes-validate's strict schemas (unknown fields are errors). The
custom resources the chart renders (ServiceMonitor, PodMonitor, PrometheusRule, ScaledObject,
GrafanaDashboard) go through the ``openAPIV3Schema`` of their vendored CRDs (tests/deploy/crds/),
made strict the same way: an object schema with properties refuses other keys unless the CRD
marks it ``x-kubernetes-preserve-unknown-fields``. The API server would silently prune such a
key; a test should not let a typo pass.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any, Final

import jsonschema
import kubernetes_validate
import yaml

CRDS: Final = Path(__file__).resolve().parent / "crds"
# The oldest version the chart supports (its kubeVersion) and the newest kubernetes-validate knows.
KUBE_VERSIONS: Final = ("1.27.0", kubernetes_validate.utils.latest_version())
_NAME_RE: Final = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"


def _openapi_to_jsonschema(node: Any) -> Any:
    if isinstance(node, list):
        return [_openapi_to_jsonschema(v) for v in node]
    if not isinstance(node, dict):
        return node
    out = {
        k: _openapi_to_jsonschema(v)
        for k, v in node.items()
        if not k.startswith("x-kubernetes-") and k not in {"nullable", "description"}
    }
    if node.get("x-kubernetes-int-or-string") and "type" not in node:
        out.setdefault("anyOf", [{"type": "integer"}, {"type": "string"}])
    if node.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"]
    if (
        "properties" in node
        and "additionalProperties" not in node
        and not node.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


@cache
def crd_validators() -> dict[tuple[str, str], jsonschema.Draft7Validator]:
    """(apiVersion, kind) -> a validator of the whole object, from the vendored CRDs."""
    out = {}
    for path in sorted(CRDS.glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
        for version in crd["spec"]["versions"]:
            schema = _openapi_to_jsonschema(version["schema"]["openAPIV3Schema"])
            # The API server validates metadata itself; the CRD only says "object".
            schema["properties"]["metadata"] = {
                "type": "object",
                "required": ["name"],
                "properties": {"name": {"type": "string", "pattern": _NAME_RE, "maxLength": 253}},
            }
            schema["required"] = sorted({*schema.get("required", []), "apiVersion", "kind", "metadata", "spec"})
            out[(f"{group}/{version['name']}", kind)] = jsonschema.Draft7Validator(schema)
    return out


def validation_errors(doc: Mapping[str, Any]) -> list[str]:
    """Everything wrong with one manifest, for every Kubernetes version in :data:`KUBE_VERSIONS`."""
    key = (doc.get("apiVersion", ""), doc.get("kind", ""))
    crd = crd_validators().get(key)
    if crd is not None:
        return [f"{'/'.join(map(str, e.absolute_path))}: {e.message[:300]}" for e in crd.iter_errors(doc)]
    problems = []
    for version in KUBE_VERSIONS:
        try:
            kubernetes_validate.validate(dict(doc), version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            problems.append(f"k8s {version}: {'/'.join(map(str, exc.path))}: {exc.message[:300]}")
        except kubernetes_validate.SchemaNotFoundError as exc:
            problems.append(f"k8s {version}: no schema for {exc.kind} {exc.api_version}")
    return problems
