"""Regenerate the generated part of helm/sidecar/values.schema.json.

The schema's top level is maintained by hand. Its ``definitions`` hold three generated families,
so that every object in the values is closed (``additionalProperties: false``) without copying
schemas by hand:

* ``sidecar.*``: the sidecar's configuration tree (``values.config``), from the pydantic model
  :class:`sidecar.config.SidecarConfig`, minus its secret fields: secrets belong in the Secret
  (``values.secrets``), never in the ConfigMap, so the schema refuses them there;
* ``io.k8s.*`` and ``k8s.VolumeSource``: the Kubernetes types the values pass through (affinity,
  tolerations, volumes...), from kubernetes-validate's strict schemas for :data:`K8S_SCHEMA_VERSION`;
* ``monitoring.coreos.com.*``: a ServiceMonitor relabeling and the endpoint's ``tlsConfig``,
  ``basicAuth`` and ``authorization``, from the vendored CRD.

    .venv/bin/python -m tests.deploy.values_schema            # rewrite the file
    .venv/bin/python -m tests.deploy.values_schema --check    # exit 1 when it is stale
"""

from __future__ import annotations

import copy
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import kubernetes_validate
import yaml

from sidecar.config import SidecarConfig
from tests.deploy.chart import CHART

SCHEMA_PATH: Final = CHART / "values.schema.json"
K8S_SCHEMA_VERSION: Final = "v1.30.0"
CRDS: Final = Path(__file__).resolve().parent / "crds"
GENERATED_PREFIXES: Final = ("sidecar.", "io.k8s.", "k8s.", "monitoring.coreos.com.")
_K8S_PREFIX: Final = "io.k8s."


def _walk(node: Any) -> Iterator[dict[str, Any]]:
    if isinstance(node, dict):
        yield node
        for v in node.values():
            yield from _walk(v)
    elif isinstance(node, list):
        for v in node:
            yield from _walk(v)


def _refs(node: Any) -> set[str]:
    return {n["$ref"].rsplit("/", 1)[-1] for n in _walk(node) if isinstance(n.get("$ref"), str)}


def _strip(node: Any, keep_descriptions: bool) -> Any:
    """A copy without titles, (optionally) descriptions and the x-kubernetes-* extensions.

    Only annotations go: a *property* named ``description`` maps to a schema, not a string."""
    if isinstance(node, dict):
        return {
            k: _strip(v, keep_descriptions)
            for k, v in node.items()
            if not k.startswith("x-kubernetes-")
            and not (isinstance(v, str) and (k == "title" or (k == "description" and not keep_descriptions)))
        }
    if isinstance(node, list):
        return [_strip(v, keep_descriptions) for v in node]
    return node


def _close_objects(node: Any) -> None:
    """Every object schema with properties refuses unknown keys."""
    for n in _walk(node):
        if "properties" in n and "additionalProperties" not in n:
            n["additionalProperties"] = False


def _is_secret(prop: Any) -> bool:
    return any(isinstance(n, dict) and n.get("writeOnly") is True for n in _walk(prop))


def sidecar_definitions() -> tuple[dict[str, Any], list[str]]:
    """The config tree's definitions (``sidecar.*``) and the dotted paths of the secrets left out."""
    raw = SidecarConfig.model_json_schema()
    defs: dict[str, Any] = {f"sidecar.{k}": v for k, v in raw.pop("$defs", {}).items()}
    defs["sidecar.SidecarConfig"] = raw
    text = json.dumps(defs).replace('"#/$defs/', '"#/definitions/sidecar.')
    defs = json.loads(text)
    secrets: list[str] = []

    def drop_secrets(name: str, path: str, seen: tuple[str, ...]) -> None:
        node = defs[name]
        for key, prop in list(node.get("properties", {}).items()):
            if _is_secret(prop):
                del node["properties"][key]
                secrets.append(f"{path}{key}")
                continue
            for ref in sorted(_refs(prop)):
                if ref not in seen:
                    drop_secrets(ref, f"{path}{key}.", (*seen, ref))

    drop_secrets("sidecar.SidecarConfig", "", ("sidecar.SidecarConfig",))
    defs = {k: _strip(v, keep_descriptions=True) for k, v in defs.items()}
    _close_objects(defs)
    return defs, sorted(secrets)


def k8s_definitions(roots: set[str]) -> dict[str, Any]:
    """The closure of the Kubernetes definitions ``roots`` refer to, strict variant, compacted."""
    path = (
        Path(kubernetes_validate.__file__).parent
        / "kubernetes-json-schema"
        / f"{K8S_SCHEMA_VERSION}-local-strict"
        / "_definitions.json"
    )
    source: dict[str, Any] = json.loads(path.read_text())["$defs"]
    out: dict[str, Any] = {}
    todo = sorted(roots)
    while todo:
        name = todo.pop()
        if name in out:
            continue
        out[name] = json.loads(json.dumps(source[name]).replace('"#/$defs/', '"#/definitions/'))
        todo.extend(sorted(_refs(out[name]) - out.keys()))
    out = {k: _strip(v, keep_descriptions=False) for k, v in out.items()}
    volume = copy.deepcopy(out["io.k8s.api.core.v1.Volume"])
    volume["properties"].pop("name")
    volume["required"] = [r for r in volume.get("required", []) if r != "name"]
    if not volume["required"]:
        del volume["required"]
    out["k8s.VolumeSource"] = volume
    return out


# ServiceMonitor endpoint fields the values pass through, definition name to the endpoint's property.
_ENDPOINT_FIELDS: Final = {"TLSConfig": "tlsConfig", "BasicAuth": "basicAuth", "Authorization": "authorization"}


def monitoring_definitions() -> dict[str, Any]:
    """A ServiceMonitor relabeling and the endpoint's tlsConfig, basicAuth and authorization."""
    crd = yaml.safe_load((CRDS / "monitoring.coreos.com_servicemonitors.yaml").read_text())
    version = next(v for v in crd["spec"]["versions"] if v["name"] == "v1")
    endpoint = version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["endpoints"]["items"]
    fields = {"RelabelConfig": endpoint["properties"]["relabelings"]["items"]}
    fields.update({name: endpoint["properties"][key] for name, key in _ENDPOINT_FIELDS.items()})
    out = {}
    for name, source in fields.items():
        definition = _strip(source, keep_descriptions=False)
        _close_objects(definition)
        out[f"monitoring.coreos.com.{name}"] = definition
    return out


def build(current: dict[str, Any]) -> dict[str, Any]:
    """``current`` with its generated definitions replaced by fresh ones."""
    schema = copy.deepcopy(current)
    kept = {k: v for k, v in schema.get("definitions", {}).items() if not k.startswith(GENERATED_PREFIXES)}
    defs: dict[str, Any] = dict(kept)
    sidecar_defs, _ = sidecar_definitions()
    defs.update(sidecar_defs)
    defs.update(monitoring_definitions())
    hand = {k: v for k, v in schema.items() if k != "definitions"}
    roots = {r for r in _refs([hand, kept]) if r.startswith(_K8S_PREFIX)}
    roots.add("io.k8s.api.core.v1.Volume")  # k8s.VolumeSource derives from it
    defs.update(k8s_definitions(roots))
    schema["definitions"] = dict(sorted(defs.items()))
    return schema


def dumps(schema: dict[str, Any]) -> str:
    return json.dumps(schema, indent=2, ensure_ascii=False) + "\n"


def secret_config_paths() -> list[str]:
    """Dotted config paths of the secret fields (they go to the Secret as SIDECAR_* variables)."""
    return sidecar_definitions()[1]


def main(argv: list[str]) -> int:
    current = json.loads(SCHEMA_PATH.read_text())
    fresh = dumps(build(current))
    if "--check" in argv:
        if SCHEMA_PATH.read_text() != fresh:
            print(f"{SCHEMA_PATH} is stale: run .venv/bin/python -m tests.deploy.values_schema", file=sys.stderr)
            return 1
        return 0
    SCHEMA_PATH.write_text(fresh)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
