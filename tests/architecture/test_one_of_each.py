"""One of each: one conversation dataset reader, one message parser, one F1.

Read from the source (AST), so a second copy fails here the day it is written:

- only :mod:`sidecar.transcript.dataset` imports ``gzip`` or reads compressed bytes
  (``zlib.decompress*``): every other module that reads a dataset goes through it;
- only the reader builds a :class:`~sidecar.transcript.model.ToolCall` from parsed JSON; the other
  builders are the Kafka event decoder (its own contract) and the redactor (it copies calls);
- only :mod:`sidecar.tools.classification` computes precision, recall or F1: no other function is
  named like one, and no other expression is a harmonic mean (``2*p*r / (p + r)``) or
  ``2*tp / (2*tp + fp + fn)``.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from tests.architecture.imports import REPO, module_name

READER = "sidecar.transcript.dataset"
METRICS = "sidecar.tools.classification"
TOOLCALL_BUILDERS = {READER, "sidecar.events", "sidecar.transcript.redact"}
# Functions that only read an F1 someone else computed (an adapter manifest's validation figure).
F1_READERS = {"sidecar.scoring.trust.manifest_f1"}
METRIC_NAME = re.compile(r"(^|_)(f1|prf|fmeasure|f_measure|precision_recall|precision|recall)(_|$)")


def _trees(root: Path) -> list[tuple[str, ast.Module]]:
    out = []
    for package in ("sidecar", "adapters"):
        for path in sorted((root / package).rglob("*.py")):
            out.append((module_name_at(root, path), ast.parse(path.read_text(encoding="utf-8"))))
    return out


def module_name_at(root: Path, path: Path) -> str:
    if root == REPO:
        return module_name(path)
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return ""


def dataset_readers(root: Path = REPO) -> list[str]:
    found = []
    for module, tree in _trees(root):
        if module == READER:
            continue
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            if any(n.split(".")[0] == "gzip" for n in names):
                found.append(f"{module}:{getattr(node, 'lineno', 0)} imports gzip")
            if isinstance(node, ast.Call) and _dotted(node.func).startswith(("zlib.decompress", "gzip.")):
                found.append(f"{module}:{node.lineno} calls {_dotted(node.func)}")
    return found


def message_parsers(root: Path = REPO) -> list[str]:
    return [
        f"{module}:{node.lineno} builds a ToolCall"
        for module, tree in _trees(root)
        if module not in TOOLCALL_BUILDERS
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and _dotted(node.func).split(".")[-1] == "ToolCall"
    ]


def _is_two_times(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.BinOp)
        and isinstance(node.op, ast.Mult)
        and (
            any(isinstance(side, ast.Constant) and side.value in (2, 2.0) for side in (node.left, node.right))
            or _is_two_times(node.left)
        )
    )


def _is_sum(node: ast.AST) -> bool:
    return isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add)


def metric_copies(root: Path = REPO) -> list[str]:
    found = []
    for module, tree in _trees(root):
        if module == METRICS:
            continue
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
                and METRIC_NAME.search(node.name)
                and f"{module}.{node.name}" not in F1_READERS
            ):
                found.append(f"{module}:{node.lineno} defines {node.name}")
            if (
                isinstance(node, ast.BinOp)
                and isinstance(node.op, ast.Div)
                and _is_two_times(node.left)
                and _is_sum(node.right)
            ):
                found.append(f"{module}:{node.lineno} computes a harmonic mean")
    return found


def test_one_dataset_reader() -> None:
    assert dataset_readers() == []


def test_one_message_parser() -> None:
    assert message_parsers() == []


def test_one_precision_recall_f1() -> None:
    assert metric_copies() == []


@pytest.mark.parametrize(
    ("code", "check"),
    [
        ("import gzip\n", dataset_readers),
        ("def f(p):\n    import gzip as g\n    return g\n", dataset_readers),
        ("import zlib\nzlib.decompressobj(31)\n", dataset_readers),
        ("from sidecar.transcript.model import ToolCall\nToolCall('a', '')\n", message_parsers),
        ("def _prf(tp, fp, fn):\n    return tp\n", metric_copies),
        ("def score(p, r):\n    return 2 * p * r / (p + r)\n", metric_copies),
        ("def score(tp, fp, fn):\n    return 2 * tp / (2 * tp + fp + fn)\n", metric_copies),
    ],
)
def test_the_checks_see_a_second_copy(tmp_path: Path, code: str, check: object) -> None:
    (tmp_path / "sidecar" / "tools").mkdir(parents=True)
    (tmp_path / "adapters").mkdir()
    (tmp_path / "sidecar" / "tools" / "copy.py").write_text(code)
    assert callable(check)
    assert check(tmp_path) != []
