"""deploy/kubernetes/, deploy/prometheus/ and the chart README's parameter table are generated from
the chart; a change to the chart without re-rendering them fails here."""

from __future__ import annotations

from tests.deploy import render


def test_rendered_files_match_the_chart(helm: str) -> None:
    assert render.stale() == [], f"run {render.COMMAND}"


def test_kubernetes_dir_holds_the_defaults_and_a_kustomization(helm: str) -> None:
    names = sorted(p.name for p in render.KUBERNETES_DIR.glob("*.yaml"))
    assert names == [
        "configmap.yaml", "deployment.yaml", "kustomization.yaml", "poddisruptionbudget.yaml", "service.yaml",
        "serviceaccount.yaml",
    ]  # fmt: skip
    for path in render.KUBERNETES_DIR.glob("*.yaml"):
        assert path.read_text().startswith(render.HEADER)
