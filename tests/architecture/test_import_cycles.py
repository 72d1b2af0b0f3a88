"""No import cycles between the modules of ``sidecar`` and ``adapters``.

The graph is read from the source (AST), not from ``sys.modules``: every ``import`` counts, also
one inside a function or under ``if TYPE_CHECKING:``, because a cycle hidden behind a lazy import
is still a cycle a reader has to untangle (and it breaks as soon as someone hoists the import).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("sidecar", "adapters")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            found[module_name(path)] = path
    return found


def _imported_names(tree: ast.Module, module: str, is_package: bool) -> Iterator[str]:
    """Every dotted name the module imports (``from a import b`` yields ``a.b`` and ``a``)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                # A relative import: strip one package level per dot (the module itself first,
                # unless it is a package's __init__).
                base = module.split(".")
                drop = node.level - (1 if is_package else 0)
                base = base[: len(base) - drop] if drop else base
                prefix = ".".join([*base, node.module] if node.module else base)
            else:
                prefix = node.module or ""
            for alias in node.names:
                yield f"{prefix}.{alias.name}"
            yield prefix


def _resolve(name: str, known: dict[str, Path]) -> str | None:
    """The module of ours that importing ``name`` loads (the longest known prefix), if any."""
    parts = name.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in known:
            return candidate
        parts.pop()
    return None


def import_graph() -> dict[str, set[str]]:
    known = modules()
    graph: dict[str, set[str]] = {}
    for module, path in known.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        is_package = path.name == "__init__.py"
        targets: set[str] = set()
        for name in _imported_names(tree, module, is_package):
            target = _resolve(name, known)
            if target is not None and target != module:
                targets.add(target)
        # ``from pkg import sub`` is an edge to ``pkg.sub`` and to ``pkg`` (whose __init__ runs).
        graph[module] = targets
    return graph


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative; components of more than one module, each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            advanced = False
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                    advanced = True
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            if advanced:
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component: list[str] = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_import_cycles() -> None:
    graph = import_graph()
    cycles = strongly_connected(graph)
    described = [
        " <-> ".join(component)
        + "\n    "
        + "\n    ".join(f"{a} -> {b}" for a in component for b in sorted(graph[a]) if b in component)
        for component in cycles
    ]
    assert not cycles, "import cycles:\n" + "\n".join(described)


def test_the_graph_covers_both_packages() -> None:
    graph = import_graph()
    assert "adapters.cli" in graph and "sidecar.app" in graph
    assert "sidecar.config" in graph["sidecar.app"]


@pytest.mark.parametrize(
    ("graph", "expected"),
    [
        ({"a": {"b"}, "b": {"a"}, "c": {"a"}}, [["a", "b"]]),
        ({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}, [["a", "b", "c"]]),
        ({"a": {"b"}, "b": set()}, []),
    ],
)
def test_cycle_finder(graph: dict[str, set[str]], expected: list[list[str]]) -> None:
    assert strongly_connected(graph) == expected


def test_lazy_and_type_checking_imports_are_edges() -> None:
    source = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from sidecar.config import Config\n"
        "def f():\n    import sidecar.events\n"
    )
    names = set(_imported_names(ast.parse(source), "sidecar.x", is_package=False))
    assert {"sidecar.config.Config", "sidecar.events"} <= names
    relative = "from .config import KafkaConfig\nfrom .. import events\n"
    names = set(_imported_names(ast.parse(relative), "sidecar.source.kafka", is_package=False))
    assert {"sidecar.source.config.KafkaConfig", "sidecar.events"} <= names
