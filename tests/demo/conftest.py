"""Fixtures for the demo tests: a real librdkafka mock cluster and a consumer to read it back."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest
import structlog
from aiokafka import AIOKafkaConsumer

from sidecar.tools.demo.mock_cluster import MockKafkaCluster


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    """`sidecar demo` configures logging for the process; undo it so other tests see the defaults."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    structlog.reset_defaults()
    for handler in [h for h in root.handlers if h not in handlers]:
        root.removeHandler(handler)
    root.setLevel(level)


@pytest.fixture(scope="module")
def kafka() -> Iterator[MockKafkaCluster]:
    with MockKafkaCluster() as cluster:
        yield cluster


async def consume_all(
    bootstrap: str, topic: str, expected: int, timeout_seconds: float = 30.0
) -> list[tuple[bytes, dict[str, Any]]]:
    """Read ``expected`` records from the start of ``topic`` (key, decoded value), or fail."""
    consumer = AIOKafkaConsumer(
        topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest", enable_auto_commit=False, group_id=None
    )
    await consumer.start()
    out: list[tuple[bytes, dict[str, Any]]] = []
    try:
        async with asyncio.timeout(timeout_seconds):
            while len(out) < expected:
                batch = await consumer.getmany(timeout_ms=500)
                for records in batch.values():
                    out.extend((r.key, json.loads(r.value.decode("utf-8"))) for r in records)
    finally:
        await consumer.stop()
    return out
