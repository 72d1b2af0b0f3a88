"""The code checks CI relies on run inside the suite: lint, formatting and strict typing.

``ruff format`` is the one formatter (settings in pyproject.toml); a file it would change fails the
suite, so a reviewer never sees formatting noise in a diff.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TREES = ["sidecar", "adapters", "tests"]


def _tool(name: str) -> str:
    found = Path(sys.executable).with_name(name)
    if found.exists():
        return str(found)
    on_path = shutil.which(name)
    if on_path is None:
        pytest.fail(f"{name} is not installed: install the dev extra (pip install -e '.[dev]')")
    return on_path


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), cwd=REPO, capture_output=True, text=True, timeout=600, check=False)


def test_ruff_lint_is_clean() -> None:
    out = _run(_tool("ruff"), "check", "--no-cache", *TREES)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]


def test_ruff_format_is_applied() -> None:
    out = _run(_tool("ruff"), "format", "--check", "--no-cache", *TREES)
    assert out.returncode == 0, "run `ruff format sidecar adapters tests`:\n" + out.stdout[-4000:]


def test_mypy_strict_is_clean() -> None:
    out = _run(_tool("mypy"), "sidecar", "adapters")
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
