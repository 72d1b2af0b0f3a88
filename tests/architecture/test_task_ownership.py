"""Structural check: the runtime service starts tasks only where an owner is known.

Every ``create_task`` / ``ensure_future`` call (on ``asyncio``, a loop or a TaskGroup) and every
thread started in ``sidecar/`` runtime code must be in the list below, with who owns what it starts.
A new background loop goes through :func:`sidecar.supervision.spawn` instead, so it is named,
owned by the application's TaskGroup and watched by ``/readyz``. The offline tools
(``sidecar/tools``) are not the service and are not checked.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import sidecar

ROOT = Path(sidecar.__file__).parent
OFFLINE = ("tools",)
SPAWNING = frozenset({"create_task", "ensure_future"})
THREADS = frozenset({"Thread", "ThreadPoolExecutor", "ProcessPoolExecutor"})

# (module, enclosing function) -> the owner of what it starts.
ALLOWED: dict[tuple[str, str], str] = {
    # The owners themselves.
    ("supervision.py", "spawn"): "a component's own task when no supervisor runs; its stop() ends it",
    ("supervision.py", "Supervisor.spawn"): "the application's TaskGroup",
    ("source/kafka.py", "KafkaEventSource.run"): "the source's TaskGroup inside run()",
    ("source/kafka.py", "KafkaEventSource.assign"): "the source's TaskGroup inside run()",
    # Per-record work whose future its creator keeps and awaits (not background loops).
    ("source/processor.py", "PartitionProcessor._fire"): "the record's pending entry (the commit waits on it)",
    ("source/processor.py", "PartitionProcessor._dead_letter"): "the record's pending entry (the commit waits on it)",
    ("alerting/ledger.py", "FeedbackLedger.record"): "the ledger's write set (cancelled at stop) and the feedback "
    "record's pending entry (the commit waits on it)",
    ("source/results.py", "KafkaResultsWriter._pump"): "the writer's in-flight set, awaited by its flush",
    ("source/results.py", "KafkaResultsWriter._retry"): "the writer's per-partition retry set, cancelled on release",
    ("clustering/live.py", "GoalClusterer._assignment"): "the conversation's assignment future, awaited by its outcome",
    # Fan-out awaited in the same call.
    ("clustering/algorithm.py", "gather_or_cancel"): "a TaskGroup local to the call",
    ("scoring/admission.py", "all_or_nothing"): "awaited in the same call",
    ("stage/pipeline.py", "_all"): "awaited in the same call",
    ("judge/judge.py", "TwoDimensionalJudge.judge"): "a TaskGroup local to the call",
    # Worker threads, shut down by their component's stop().
    ("scoring/scorers.py", "Scorers.__init__"): "prompt-encoding threads; Scorers.stop() shuts them down",
    ("training_store/sink.py", "TrainingStoreSink.start"): "the writer thread; TrainingStoreSink.stop() joins it",
}


def _runtime_modules() -> Iterator[Path]:
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT)
        if rel.parts[0] not in OFFLINE:
            yield path


def _called_name(node: ast.Call) -> str | None:
    func = node.func
    if isinstance(func, ast.Attribute):
        return func.attr
    if isinstance(func, ast.Name):
        return func.id
    return None


class _Finder(ast.NodeVisitor):
    def __init__(self) -> None:
        self.scope: list[str] = []
        self.found: list[tuple[str, int, str]] = []

    def _enter(self, node: ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self.scope.append(node.name)
        self.generic_visit(node)
        self.scope.pop()

    visit_ClassDef = _enter
    visit_FunctionDef = _enter
    visit_AsyncFunctionDef = _enter

    def _owner(self) -> str:
        # Nested helpers count as their outermost function (a method: Class.method).
        if len(self.scope) >= 2 and self.scope[0][:1].isupper():
            return ".".join(self.scope[:2])
        return self.scope[0] if self.scope else "<module>"

    def visit_Call(self, node: ast.Call) -> None:
        name = _called_name(node)
        if name in SPAWNING or name in THREADS:
            self.found.append((self._owner(), node.lineno, name))
        self.generic_visit(node)


def _spawn_sites() -> dict[tuple[str, str], list[str]]:
    sites: dict[tuple[str, str], list[str]] = {}
    for path in _runtime_modules():
        finder = _Finder()
        finder.visit(ast.parse(path.read_text(encoding="utf-8"), str(path)))
        module = path.relative_to(ROOT).as_posix()
        for owner, line, name in finder.found:
            sites.setdefault((module, owner), []).append(f"{module}:{line} {name}")
    return sites


def test_tasks_and_threads_start_only_in_the_listed_owners() -> None:
    unlisted = {site: where for site, where in _spawn_sites().items() if site not in ALLOWED}
    assert not unlisted, (
        "background work started outside a known owner (use sidecar.supervision.spawn, or list the "
        f"place in ALLOWED with its owner): {unlisted}"
    )


def test_every_listed_owner_still_exists() -> None:
    """A stale entry would let a future call there through unseen: the list stays exact."""
    stale = sorted(set(ALLOWED) - set(_spawn_sites()))
    assert not stale, f"ALLOWED lists places that no longer start tasks or threads: {stale}"


def test_the_finder_sees_every_form() -> None:
    source = (
        "import asyncio, threading\n"
        "async def a():\n    asyncio.create_task(x())\n"
        "class C:\n    def m(self):\n        loop.create_task(y())\n"
        "        def inner():\n            asyncio.ensure_future(z())\n"
        "def t():\n    threading.Thread(target=f).start()\n"
    )
    finder = _Finder()
    finder.visit(ast.parse(source))
    assert [(o, n) for o, _, n in finder.found] == [
        ("a", "create_task"),
        ("C.m", "create_task"),
        ("C.m", "ensure_future"),
        ("t", "Thread"),
    ]
