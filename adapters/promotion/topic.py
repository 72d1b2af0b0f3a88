"""Reading and writing the routing topic from a job (the sidecar's own table and publisher)."""

from __future__ import annotations

import asyncio

from prometheus_client import CollectorRegistry

from adapters.errors import ServeError
from sidecar.config import SidecarConfig
from sidecar.fleet.publisher import PublishFailed, TablePublisher
from sidecar.fleet.topics import ensure_compacted_topic
from sidecar.scoring.routes import RouteRow, encode_route, routes_table

READ_TIMEOUT_SECONDS = 60.0
WRITE_TIMEOUT_SECONDS = 30.0


def topic_of(config: SidecarConfig) -> str:
    return config.scoring.routing.topic_name(config.kafka.topic)


async def read_rows(config: SidecarConfig, *, timeout_seconds: float = READ_TIMEOUT_SECONDS) -> dict[str, RouteRow]:
    """Every agent's current row: the topic read to its end (created first when the config says so)."""
    routing = config.scoring.routing
    if routing.create_topic:
        await ensure_compacted_topic(config.kafka, topic_of(config), replication_factor=routing.replication_factor)
    table = routes_table(topic_of(config), config.kafka, CollectorRegistry())
    await table.start()
    try:
        async with asyncio.timeout(timeout_seconds):
            await table.wait_caught_up()
    except TimeoutError:
        raise ServeError(f"could not read the routing topic {topic_of(config)} within {timeout_seconds:.0f}s") from None
    finally:
        await table.stop()
    return dict(table.items())


async def write_row(config: SidecarConfig, row: RouteRow) -> None:
    publisher = TablePublisher(topic_of(config), config.kafka)
    try:
        await publisher.publish(row.agent, encode_route(row), timeout_seconds=WRITE_TIMEOUT_SECONDS)
    except PublishFailed as exc:
        raise ServeError(f"the routing row was not written: {exc}") from None
    finally:
        await publisher.stop()
