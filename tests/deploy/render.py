"""Write the files derived from the chart, or check that they are current.

* ``deploy/kubernetes/``: the manifests of the chart's default values, one file per resource, plus
  a ``kustomization.yaml`` (``kubectl apply -k deploy/kubernetes``);
* ``deploy/prometheus/sidecar-alerts.yaml``: the chart's alert rules as a plain Prometheus rule
  file, for a Prometheus without the Operator (and for ``promtool``);
* the parameter table of ``helm/sidecar/README.md``, from the ``## @param`` lines of values.yaml.

    .venv/bin/python -m tests.deploy.render            # rewrite them
    .venv/bin/python -m tests.deploy.render --check    # exit 1 and name the stale ones
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import yaml

from tests.deploy.chart import CHART, DEPLOY, NAMESPACE, REPO, render, render_text, rule_groups

KUBERNETES_DIR: Final = DEPLOY / "kubernetes"
RULES_FILE: Final = DEPLOY / "prometheus" / "sidecar-alerts.yaml"
CHART_README: Final = CHART / "README.md"
COMMAND: Final = ".venv/bin/python -m tests.deploy.render"
HEADER: Final = f"# Rendered from helm/sidecar with its default values by `{COMMAND}`: do not edit.\n"
TABLE_START: Final = "<!-- parameters:start -->"
TABLE_END: Final = "<!-- parameters:end -->"
_SOURCE: Final = re.compile(r"^---\n# Source: [^\n]*\n", re.MULTILINE)
_PARAM: Final = re.compile(r"^\s*## @param (\S+) (.*)$")
_SECTION: Final = re.compile(r"^\s*## @section (.*)$")


def kubernetes_files() -> dict[Path, str]:
    """deploy/kubernetes/: one file per rendered resource, named after its kind."""
    text = render_text()
    out: dict[Path, str] = {}
    for chunk in _SOURCE.split(text):
        body = chunk.strip("\n")
        doc = yaml.safe_load(body) if body else None
        if not doc or "helm.sh/hook" in (doc["metadata"].get("annotations") or {}):
            continue  # hooks (the `helm test` pod) are Helm's, not part of the plain manifests
        name = f"{doc['kind'].lower()}.yaml"
        if KUBERNETES_DIR / name in out:
            name = f"{doc['kind'].lower()}-{doc['metadata']['name']}.yaml"
        out[KUBERNETES_DIR / name] = HEADER + body + "\n"
    resources = "".join(f"  - {p.name}\n" for p in sorted(out))
    out[KUBERNETES_DIR / "kustomization.yaml"] = (
        HEADER
        + "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
        + f"namespace: {NAMESPACE}\nresources:\n{resources}"
    )
    return out


class _RuleDumper(yaml.SafeDumper):
    """Multi-line strings (PromQL) as literal blocks, so the rule file reads like the chart."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_RuleDumper.add_representer(str, _str)


def rules_file() -> str:
    groups = rule_groups(render(set_values={"prometheusRule.enabled": "true"}))
    body = yaml.dump({"groups": groups}, Dumper=_RuleDumper, sort_keys=False, width=10_000, allow_unicode=True)
    return (
        "# The chart's alert rules with their default thresholds, as a Prometheus rule file\n"
        "# (rule_files: in prometheus.yml). Rendered from helm/sidecar (prometheusRule.enabled=true)\n"
        f"# by `{COMMAND}`: do not edit.\n" + body
    )


@dataclass(frozen=True)
class Param:
    key: str
    description: str
    section: str


def params(values_text: str | None = None) -> list[Param]:
    """The ``## @param`` lines of values.yaml, in order, with their section."""
    text = values_text if values_text is not None else (CHART / "values.yaml").read_text()
    section = ""
    out = []
    for line in text.splitlines():
        if m := _SECTION.match(line):
            section = m.group(1).strip()
        elif m := _PARAM.match(line):
            out.append(Param(m.group(1), m.group(2).strip(), section))
    return out


def value_at(values: Any, dotted: str) -> Any:
    node = values
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            raise KeyError(dotted)
        node = node[part]
    return node


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def parameter_table() -> str:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    lines = []
    section = None
    for p in params():
        if p.section != section:
            section = p.section
            lines += ["", f"### {section}", "", "| name | description | default |", "|---|---|---|"]
        default = json.dumps(value_at(values, p.key), ensure_ascii=False)
        if len(default) > 60:
            default = "see values.yaml"
        lines.append(f"| `{p.key}` | {_cell(p.description)} | `{_cell(default)}` |")
    return "\n".join(lines).strip("\n")


def chart_readme() -> str:
    text = CHART_README.read_text()
    start = text.index(TABLE_START) + len(TABLE_START)
    end = text.index(TABLE_END)
    return text[:start] + "\n\n" + parameter_table() + "\n\n" + text[end:]


def expected() -> dict[Path, str]:
    files = kubernetes_files()
    files[RULES_FILE] = rules_file()
    files[CHART_README] = chart_readme()
    return files


def stale() -> list[str]:
    """Files that differ from what the chart renders now, and rendered files left over."""
    files = expected()
    out = [str(p.relative_to(REPO)) for p, text in files.items() if not p.is_file() or p.read_text() != text]
    out += [str(p.relative_to(REPO)) for p in KUBERNETES_DIR.glob("*.yaml") if p not in files]
    return sorted(out)


def write() -> None:
    files = expected()
    for p in KUBERNETES_DIR.glob("*.yaml"):
        if p not in files:
            p.unlink()
    for p, text in files.items():
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)


def main(argv: list[str]) -> int:
    if "--check" in argv:
        names = stale()
        for name in names:
            print(f"stale: {name} (run {COMMAND})", file=sys.stderr)
        return 1 if names else 0
    write()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
