"""Structural check: no ``asyncio.wait_for`` in the service or the adapter tooling.

On Python 3.11 (the oldest this project supports) ``wait_for`` returns the awaited result and drops
the caller's cancellation when both happen in the same loop iteration (CPython issue gh-86296,
fixed in 3.12). A loop that waits that way can outlive its stop: a partition worker did, and held
a whole shutdown forever. ``async with asyncio.timeout(...)`` keeps the cancellation; use it.
"""

from __future__ import annotations

import ast

from tests.architecture.imports import REPO, source_files


def _wait_for_calls(source: str) -> list[int]:
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Attribute) and func.attr == "wait_for":
                if isinstance(func.value, ast.Name) and func.value.id == "asyncio":
                    lines.append(node.lineno)
            elif isinstance(func, ast.Name) and func.id == "wait_for":
                lines.append(node.lineno)
    return lines


def test_no_asyncio_wait_for() -> None:
    found = [
        f"{path.relative_to(REPO)}:{line}"
        for path in source_files("sidecar", "adapters")
        for line in _wait_for_calls(path.read_text(encoding="utf-8"))
    ]
    assert not found, f"asyncio.wait_for can swallow a cancellation on Python 3.11; use asyncio.timeout: {found}"


def test_the_check_sees_both_forms_and_not_condition_wait_for() -> None:
    source = (
        "import asyncio\nfrom asyncio import wait_for\n"
        "async def f(cond):\n"
        "    await asyncio.wait_for(x(), 1)\n"
        "    await wait_for(y(), 2)\n"
        "    await cond.wait_for(lambda: True)\n"
    )
    assert _wait_for_calls(source) == [4, 5]
