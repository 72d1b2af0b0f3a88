"""Suite-wide fixtures and plugins."""

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
