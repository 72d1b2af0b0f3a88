"""One OpenAI-compatible endpoint layer, one retry layer, one jitter policy (an AST scan).

Outside ``sidecar/llm`` nothing in ``sidecar/`` or ``adapters/`` may build an ``openai`` client,
define a circuit breaker, or classify ``openai`` errors itself; outside ``sidecar/retry.py`` and
``sidecar/llm`` no loop may retry after a sleep it computed itself (loops that wait by
``sidecar.retry``'s ``Backoff``/``backoff_delay`` are the one retry layer, e.g. the alert sinks'
reconnect loops), and nothing may draw a jitter from ``random``.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LLM_LAYER = ROOT / "sidecar" / "llm"
RETRY_LAYER = ROOT / "sidecar" / "retry.py"
CLIENT_CLASSES = {"OpenAI", "AsyncOpenAI", "AzureOpenAI", "AsyncAzureOpenAI"}
# Names that come from the one retry layer: a loop using one of them waits by its policy.
RETRY_LAYER_NAMES = {"Backoff", "backoff_delay", "until_accepted"}
JITTER_CALLS = {"random", "uniform", "gauss", "expovariate", "triangular", "betavariate"}


def _modules() -> list[Path]:
    files = sorted([*(ROOT / "sidecar").rglob("*.py"), *(ROOT / "adapters").rglob("*.py")])
    assert len(files) > 50, "the scan found too few modules: wrong root?"
    return files


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def _in_llm_layer(path: Path) -> bool:
    return LLM_LAYER in path.parents


def _called_name(call: ast.Call) -> str | None:
    func = call.func
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return None


def client_constructions(tree: ast.AST) -> Iterator[int]:
    """Lines calling ``OpenAI(...)``/``AsyncOpenAI(...)`` (bare or as ``openai.AsyncOpenAI``)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and _called_name(node) in CLIENT_CLASSES:
            yield node.lineno


def breaker_classes(tree: ast.AST) -> Iterator[int]:
    """Lines defining a class named like a circuit breaker."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and "breaker" in node.name.lower():
            yield node.lineno


def error_classifiers(tree: ast.AST) -> Iterator[int]:
    """Lines of ``except``/``isinstance`` on ``openai``'s status or connection errors."""
    watched = {"APIStatusError", "APIConnectionError", "APITimeoutError", "RateLimitError", "InternalServerError"}

    def names(node: ast.AST | None) -> set[str]:
        if node is None:
            return set()
        return {n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
                and n.value.id == "openai"}  # fmt: skip

    for node in ast.walk(tree):
        if isinstance(node, ast.ExceptHandler) and names(node.type) & watched:
            yield node.lineno
        if isinstance(node, ast.Call) and _called_name(node) == "isinstance" and names(node) & watched:
            yield node.lineno


def own_retry_loops(tree: ast.AST) -> Iterator[int]:
    """Lines of loops that catch an exception and sleep, without the one retry layer's delays."""
    for node in ast.walk(tree):
        if not isinstance(node, ast.While | ast.For | ast.AsyncFor):
            continue
        inner = list(ast.walk(node))
        catches = any(isinstance(n, ast.Try) and n.handlers for n in inner)
        sleeps = any(isinstance(n, ast.Call) and _called_name(n) == "sleep" for n in inner)
        if not (catches and sleeps):
            continue
        if _uses_retry_layer(tree, node):
            continue
        yield node.lineno


def _uses_retry_layer(tree: ast.AST, loop: ast.AST) -> bool:
    """The loop (or the function around it) takes its delays from :mod:`sidecar.retry`."""
    for func in ast.walk(tree):
        if isinstance(func, ast.FunctionDef | ast.AsyncFunctionDef) and loop in ast.walk(func):
            used = {n.id for n in ast.walk(func) if isinstance(n, ast.Name)}
            used |= {n.attr for n in ast.walk(func) if isinstance(n, ast.Attribute)}
            if used & RETRY_LAYER_NAMES:
                return True
    return False


def jitter_draws(tree: ast.AST) -> Iterator[int]:
    """Lines calling ``random.random()``/``random.uniform()``... (a jitter policy of its own)."""
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in JITTER_CALLS
                and isinstance(node.func.value, ast.Name) and node.func.value.id == "random"):  # fmt: skip
            yield node.lineno


def _violations() -> dict[str, list[str]]:
    found: dict[str, list[str]] = {"client": [], "breaker": [], "classifier": [], "retry_loop": [], "jitter": []}
    for path in _modules():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        if not _in_llm_layer(path):
            found["client"] += [f"{_rel(path)}:{n}" for n in client_constructions(tree)]
            found["breaker"] += [f"{_rel(path)}:{n}" for n in breaker_classes(tree)]
            found["classifier"] += [f"{_rel(path)}:{n}" for n in error_classifiers(tree)]
            if path != RETRY_LAYER:
                found["retry_loop"] += [f"{_rel(path)}:{n}" for n in own_retry_loops(tree)]
        if path != RETRY_LAYER:
            found["jitter"] += [f"{_rel(path)}:{n}" for n in jitter_draws(tree)]
    return found


VIOLATIONS = _violations()


@pytest.mark.parametrize("kind", sorted(VIOLATIONS))
def test_one_llm_layer_and_one_retry_layer(kind: str) -> None:
    assert VIOLATIONS[kind] == [], f"{kind} outside sidecar/llm or sidecar/retry.py: {VIOLATIONS[kind]}"


# -- the scan itself finds what it must (each rule can fail) --------------------------------------

DUPLICATES = """
import asyncio, random
import openai
from openai import AsyncOpenAI

class MyBreaker:
    pass

async def call(client):
    a = openai.AsyncOpenAI(base_url="http://x/v1", api_key="k")
    b = AsyncOpenAI(base_url="http://x/v1", api_key="k")
    delay = 0.1
    while True:
        try:
            return await client.chat.completions.create()
        except openai.APIStatusError as exc:
            if isinstance(exc, openai.RateLimitError | openai.APIConnectionError):
                pass
            await asyncio.sleep(delay * random.random())
            delay *= 2
"""

THE_LAYER = """
import asyncio
from sidecar.retry import Backoff

async def reconnect(connect):
    backoff = Backoff(0.1, 1.0)
    while True:
        try:
            return await connect()
        except OSError:
            await asyncio.sleep(backoff.delay())
"""


def test_the_scan_finds_each_kind_of_duplicate() -> None:
    tree = ast.parse(DUPLICATES)
    assert len(list(client_constructions(tree))) == 2
    assert len(list(breaker_classes(tree))) == 1
    assert len(list(error_classifiers(tree))) == 2
    assert len(list(own_retry_loops(tree))) == 1
    assert len(list(jitter_draws(tree))) == 1


def test_a_loop_waiting_by_the_retry_layer_passes() -> None:
    tree = ast.parse(THE_LAYER)
    assert list(own_retry_loops(tree)) == [] and list(jitter_draws(tree)) == []
