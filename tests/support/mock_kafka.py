"""Suite-wide fixtures for tests on librdkafka's mock Kafka cluster.

* ``kafka``: the bootstrap servers of a one-broker mock cluster, one per test module (a module's
  tests share topics by name, so each uses its own);
* ``running``: the list a test appends its started sidecars to; each one still running is closed
  when the test ends, passed or failed.

A module that needs something else under one of these names defines its own fixture, which wins.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING

import pytest

from sidecar.tools.demo.mock_cluster import MockKafkaCluster

if TYPE_CHECKING:
    from tests.integration.test_kafka_source import Running


@pytest.fixture(scope="module")
def kafka() -> Iterator[str]:
    with MockKafkaCluster(1) as cluster:
        yield cluster.bootstrap_servers


@pytest.fixture
async def running() -> AsyncIterator[list[Running]]:
    started: list[Running] = []
    yield started
    for r in started:
        if not r.task.done():
            await r.close()
