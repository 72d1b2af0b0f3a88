"""The project's import graph, read from the source (every import statement, at any depth).

Imports inside functions and under ``TYPE_CHECKING`` count: a lazy import is still a dependency.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("sidecar", "adapters")


@dataclass(frozen=True)
class Import:
    module: str  # the importing module, dotted
    target: str  # the imported module (or module.attribute for ``from x import y``), dotted
    line: int


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def source_files(*packages: str) -> Iterator[Path]:
    for package in packages or PACKAGES:
        yield from sorted((REPO / package).rglob("*.py"))


def imports_of(path: Path) -> Iterator[Import]:
    module = module_name(path)
    is_package = path.name == "__init__.py"
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Import(module, alias.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".") if is_package else module.split(".")[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                yield Import(module, f"{base}.{alias.name}", node.lineno)


def all_imports(*packages: str) -> list[Import]:
    return [imp for path in source_files(*packages) for imp in imports_of(path)]


def within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")
