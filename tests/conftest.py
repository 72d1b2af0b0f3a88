"""Suite-wide fixtures and plugins.

The suite runs on two pytest-xdist workers (``-n 2`` in pyproject.toml): most of its time is spent
waiting on brokers, restarts and timers, which one worker can do while the other computes. Every
test that uses a vLLM server (one of the session fixtures below, or marked ``vllm`` because it
starts its own) runs on the same worker, so each server starts once and two never compete for the
CPU cores or the compile cache.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
import structlog

pytest_plugins: list[str] = [
    "tests.support.vllm_server",
    "tests.support.bundled_vllm",
    "tests.support.corpora",
    "tests.support.tansu",
    "tests.support.gemma",
    "tests.support.mock_kafka",
]


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    """Tests that run a CLI configure logging for the whole process: undo it after each test, so
    no later test logs into a stream the runner has closed."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    structlog.reset_defaults()
    for h in list(root.handlers):
        if h not in handlers:
            root.removeHandler(h)
    root.setLevel(level)


#: Session fixtures that are (or start) a vLLM server.
VLLM_FIXTURES = frozenset({"vllm_server", "bundled_vllm", "gemma_base"})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        if fixtures & VLLM_FIXTURES or item.get_closest_marker("vllm") is not None:
            item.add_marker(pytest.mark.xdist_group("vllm"))
