"""Offline scoring uses the scorer factory, never the live policy.

``sidecar.scoring.scorers.Scorers`` is what offline tools score with; ``ScoringHooks`` adds the
live policy (sampling, budgets, debounce, waiting, errors as outcomes) that an offline run must not
be subject to by accident. So the offline tools (``sidecar/tools``), ``adapters`` and the
benchmarks (``tests/bench``) neither import ``sidecar.scoring.hooks`` nor name ``ScoringHooks``.

One declared exception: ``sidecar eval-alerts`` measures alerts as ``sidecar run`` sends them, so it
must replay through the live hooks (debounce, sampling, budgets, errors as outcomes) on purpose.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.architecture.imports import imports_of, module_name, source_files, within

OFFLINE = ("sidecar/tools", "adapters", "tests/bench")
LIVE_POLICY_MODULE = "sidecar.scoring.hooks"
LIVE_POLICY = "ScoringHooks"
# The labelled replay of alerts: it is the live policy under test, not an offline scorer.
DECLARED = ("sidecar.tools.eval.alert_cli",)


def live_policy_uses(path: Path) -> list[str]:
    """Where ``path`` imports the live policy's module or names the live policy, as ``module:line``."""
    where = module_name(path)
    found = [f"{where}:{imp.line} imports {imp.target}" for imp in imports_of(path)
             if within(imp.target, LIVE_POLICY_MODULE)]  # fmt: skip
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Name | ast.Attribute):
            if (node.id if isinstance(node, ast.Name) else node.attr) == LIVE_POLICY:
                found.append(f"{where}:{node.lineno} names {LIVE_POLICY}")
        # importlib.import_module("sidecar.scoring.hooks") and the like
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and within(node.value, LIVE_POLICY_MODULE):
            found.append(f"{where}:{node.lineno} names {node.value}")
    return found


def test_the_offline_paths_exist() -> None:
    for folder in OFFLINE:
        assert any(source_files(folder)), folder


def test_offline_scoring_never_constructs_the_live_policy() -> None:
    checked = [path for path in source_files(*OFFLINE) if module_name(path) not in DECLARED]
    uses = [use for path in checked for use in live_policy_uses(path)]
    assert uses == []


def test_the_declared_exception_still_uses_the_live_policy() -> None:
    """An exception that no longer needs the live policy is dropped from DECLARED, not kept open."""
    paths = {module_name(path): path for path in source_files(*OFFLINE)}
    assert all(live_policy_uses(paths[name]) for name in DECLARED)


@pytest.mark.parametrize(
    "source",
    [
        "from sidecar.scoring.hooks import ScoringHooks\n",
        "def f():\n    from sidecar.scoring import hooks\n",
        "import sidecar.scoring.hooks as h\n",
        "def f(m):\n    return m.ScoringHooks.from_config(None, None)\n",
        "import importlib\nmod = importlib.import_module('sidecar.scoring.hooks')\n",
    ],
)
def test_the_check_sees_each_way_in(source: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.architecture import imports

    tool = tmp_path / "sidecar" / "tools" / "x.py"
    tool.parent.mkdir(parents=True)
    tool.write_text(source)
    monkeypatch.setattr(imports, "REPO", tmp_path)
    assert live_policy_uses(tool)


def test_the_check_lets_the_factory_through(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.architecture import imports

    tool = tmp_path / "sidecar" / "tools" / "x.py"
    tool.parent.mkdir(parents=True)
    tool.write_text(
        '"""Scores as the live ScoringHooks do."""\n'
        "from sidecar.scoring.scorers import Scorers\n"
        "def f(config, registry):\n    return Scorers.from_config(config, registry)\n"
    )
    monkeypatch.setattr(imports, "REPO", tmp_path)
    assert live_policy_uses(tool) == []
