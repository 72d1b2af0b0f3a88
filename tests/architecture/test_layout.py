"""The tree shows the system: the runtime service never depends on the offline tools.

``sidecar/tools`` (demo, eval, judge and clustering command lines, simulator, local vLLM launcher)
and ``adapters`` are tools. The service (everything else under ``sidecar/``) must not import them,
and must install and start without the tools' extra dependencies.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.architecture.imports import REPO, all_imports, within

TOOLS = "sidecar.tools"
# The `sidecar` command line is the one front door: it registers the tools' subcommands (each
# tool's heavy dependencies are imported only when its command runs).
FRONT_DOOR = {"sidecar.cli", "sidecar.__main__"}
TOOL_ONLY_DEPENDENCIES = ("rich", "confluent_kafka", "matplotlib", "torch", "transformers", "peft")


def runtime_imports() -> list[str]:
    return [
        f"{imp.module}:{imp.line} imports {imp.target}"
        for imp in all_imports("sidecar")
        if not within(imp.module, TOOLS) and imp.module not in FRONT_DOOR
        if within(imp.target, TOOLS)
        or within(imp.target, "adapters")
        or any(within(imp.target, dep) for dep in TOOL_ONLY_DEPENDENCIES)
    ]


def test_the_runtime_service_imports_no_tool() -> None:
    assert runtime_imports() == []


def test_the_import_check_sees_a_lazy_tool_import(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The check must catch the hidden kind of dependency too: an import inside a function.
    from tests.architecture import imports

    pkg = tmp_path / "sidecar"
    (pkg / "scoring").mkdir(parents=True)
    (pkg / "scoring" / "x.py").write_text("def f():\n    from sidecar.tools.demo import cli\n")
    monkeypatch.setattr(imports, "REPO", tmp_path)
    found = [(i.module, i.target) for i in imports.all_imports("sidecar") if within(i.target, TOOLS)]
    assert found == [("sidecar.scoring.x", "sidecar.tools.demo.cli")]


def test_tools_live_under_sidecar_tools() -> None:
    misplaced = [name for name in ("demo", "eval", "simulator") if (REPO / "sidecar" / name).exists()] + [
        path
        for path in ("sidecar/judge/cli.py", "sidecar/clustering/cli.py", "sidecar/scoring/local_vllm.py")
        if (REPO / path).exists()
    ]
    assert misplaced == []


def test_the_service_starts_without_the_tools_dependencies() -> None:
    # A fresh interpreter where the tools' extra dependencies cannot be imported: the service's
    # modules import, the command line parses and `sidecar config check` validates a config.
    blocked = ", ".join(repr(d) for d in TOOL_ONLY_DEPENDENCIES)
    script = textwrap.dedent(
        f"""
        import importlib.abc, sys

        class Block(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in ({blocked},):
                    raise ImportError("blocked: " + name)
                return None

        sys.meta_path.insert(0, Block())
        import sidecar.app, sidecar.source.kafka, sidecar.clustering.live, sidecar.judge.hooks
        from sidecar.cli import main
        rc = main(["config", "check"])
        loaded = sorted(m for m in sys.modules if m.startswith("sidecar.tools.demo.display"))
        print("rc", rc, "loaded", loaded)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120, check=False
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "rc 0 loaded []" in out.stdout
