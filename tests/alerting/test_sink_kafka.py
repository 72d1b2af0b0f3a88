"""The Kafka sink against librdkafka's mock cluster: records keyed by conversation, valid payloads."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer

from sidecar.alerting.config import KafkaAlertSinkConfig, RetryConfig
from sidecar.alerting.sinks.base import AlertDeliveryError, AlertRejected
from sidecar.alerting.sinks.kafka import KafkaAlertSink
from sidecar.source.config import KafkaConfig
from sidecar.tools.demo.mock_cluster import MockKafkaCluster
from sidecar.tools.ports import free_port
from tests.alerting.alerts import hostile_alert, make_alert
from tests.integration.kafka_support import read_topic

FAST_RETRY = RetryConfig(initial_backoff_seconds=0.05, max_backoff_seconds=0.2)


@pytest.fixture(scope="module")
def bootstrap() -> Iterator[str]:
    with MockKafkaCluster(1) as cluster:
        yield cluster.bootstrap_servers


@asynccontextmanager
async def running(bootstrap: str, topic: str, timeout_seconds: float = 30) -> AsyncIterator[KafkaAlertSink]:
    sink = KafkaAlertSink(
        KafkaAlertSinkConfig(enabled=True, topic=topic, timeout_seconds=timeout_seconds),
        KafkaConfig(bootstrap_servers=bootstrap, request_timeout_ms=5000),
        FAST_RETRY,
    )
    await sink.start()
    try:
        yield sink
    finally:
        await sink.stop()


async def test_alerts_land_keyed_by_conversation(bootstrap: str, validate_payload: Callable[[Any], None]) -> None:
    alerts = [make_alert(1), make_alert(2), make_alert(1, turn=4, id="4" * 32), hostile_alert(3)]
    async with running(bootstrap, "alerts.keyed") as sink:
        for alert in alerts:
            await sink.send(alert)
        assert sink.health().ready
    records = await read_topic(bootstrap, "alerts.keyed")
    assert len(records) == len(alerts)
    by_id = {json.loads(r.value)["id"]: r for r in records}
    assert set(by_id) == {a.id for a in alerts}
    for alert in alerts:
        record = by_id[alert.id]
        payload = json.loads(record.value)
        validate_payload(payload)
        assert record.key == payload["conversation_id"].encode()
        assert dict(record.headers)["alert_id"] == alert.id.encode()
    # One conversation's alerts share a key, hence a partition, hence their order.
    conv1 = [r for r in records if r.key == b"conv-1"]
    assert len({r.partition for r in conv1}) == 1
    assert [json.loads(r.value)["turn"] for r in sorted(conv1, key=lambda r: r.offset)] == [1, 4]


async def test_unreachable_brokers_are_a_retryable_failure() -> None:
    async with running(f"127.0.0.1:{free_port()}", "alerts.nowhere", timeout_seconds=1) as sink:
        with pytest.raises(AlertDeliveryError, match="no connection to the brokers within 1s"):
            await sink.send(make_alert())
        health = sink.health()
        assert not health.ready
        assert health.detail.startswith("connecting: KafkaConnectionError")


async def test_a_record_the_producer_refuses_is_rejected(bootstrap: str) -> None:
    # A producer whose size limit is below the alert's: the same record would fail every time.
    sink = KafkaAlertSink(
        KafkaAlertSinkConfig(enabled=True, topic="alerts.small"),
        KafkaConfig(bootstrap_servers=bootstrap),
        FAST_RETRY,
        producer_factory=lambda: AIOKafkaProducer(bootstrap_servers=bootstrap, max_request_size=1024),
    )
    await sink.start()
    try:
        with pytest.raises(AlertRejected, match="MessageSizeTooLargeError"):
            await sink.send(hostile_alert(1))
        await sink.send(make_alert(2))
        assert sink.health().ready
    finally:
        await sink.stop()
