"""The MQTT sink against real Mosquitto: the machine's broker for delivery, private brokers (own
port, config and data) for outages, ACLs and TLS with authentication."""

from __future__ import annotations

import asyncio
import json
import subprocess
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Literal

import aiomqtt
import pytest

from sidecar.alerting.config import MqttSinkConfig, RetryConfig
from sidecar.alerting.sinks.base import AlertDeliveryError, AlertRejected
from sidecar.alerting.sinks.mqtt import MqttAlertSink
from sidecar.tools.ports import free_port
from tests.alerting.alerts import hostile_alert, make_alert
from tests.alerting.servers import Mosquitto, wait_until

FAST_RETRY = RetryConfig(initial_backoff_seconds=0.05, max_backoff_seconds=0.2)


def sink_config(port: int, prefix: str, **overrides: Any) -> MqttSinkConfig:
    values: dict[str, Any] = {
        "enabled": True,
        "port": port,
        "client_id": f"sidecar-test-{uuid.uuid4().hex[:12]}",
        "topic_template": prefix + "/{tenant}/{agent}/{kind}",
        "timeout_seconds": 5.0,
    }
    values.update(overrides)
    return MqttSinkConfig(**values)


@asynccontextmanager
async def running(cfg: MqttSinkConfig) -> AsyncIterator[MqttAlertSink]:
    sink = MqttAlertSink(cfg, FAST_RETRY)
    await sink.start()
    try:
        yield sink
    finally:
        await sink.stop()


class Subscriber:
    """Collects every message under ``prefix/#`` (MQTT 5, so publish properties arrive too)."""

    def __init__(self, port: int, pattern: str, qos: int = 1) -> None:
        self.port = port
        self.pattern = pattern
        self.qos = qos
        self.messages: list[aiomqtt.Message] = []

    @asynccontextmanager
    async def listening(self) -> AsyncIterator[Subscriber]:
        async with aiomqtt.Client("127.0.0.1", self.port, protocol=aiomqtt.ProtocolVersion.V5) as client:
            await client.subscribe(self.pattern, qos=self.qos)

            async def collect() -> None:
                async for message in client.messages:
                    self.messages.append(message)

            task = asyncio.create_task(collect())
            try:
                yield self
            finally:
                task.cancel()
                await asyncio.wait({task})

    def payloads(self) -> list[dict[str, Any]]:
        out = []
        for m in self.messages:
            assert isinstance(m.payload, bytes)
            out.append(json.loads(m.payload))
        return out


@pytest.mark.parametrize("protocol", ["5", "3.1.1"])
@pytest.mark.parametrize("qos", [1, 2])
async def test_alerts_arrive_acknowledged_with_topic_and_payload(
    shared_mosquitto: int,
    protocol: Literal["5", "3.1.1"],
    qos: Literal[1, 2],
    validate_payload: Callable[[Any], None],
) -> None:
    # QoS 2: each send returns only after the broker's PUBCOMP (the four-packet exchange); the
    # subscriber asks for QoS 2 too, so the broker delivers at the QoS the sink published with.
    prefix = f"sidecar-test/{uuid.uuid4().hex}"
    alerts = [make_alert(n) for n in range(20)]
    async with (
        Subscriber(shared_mosquitto, prefix + "/#", qos=qos).listening() as sub,
        running(sink_config(shared_mosquitto, prefix, protocol=protocol, qos=qos)) as sink,
    ):
        await asyncio.gather(*(sink.send(a) for a in alerts))  # concurrent sends, each acknowledged
        assert sink.health().ready
        await wait_until(lambda: len(sub.messages) >= len(alerts), "20 alerts at the subscriber")
    assert {str(m.topic) for m in sub.messages} == {f"{prefix}/acme/support-bot/uncertain_turn"}
    assert {m.qos for m in sub.messages} == {qos}
    assert sorted(p["id"] for p in sub.payloads()) == sorted(a.id for a in alerts)
    for payload in sub.payloads():
        validate_payload(payload)
    props = sub.messages[0].properties
    if protocol == "5":
        assert props is not None
        assert getattr(props, "ContentType", None) == "application/json"
        assert ("alert_id", sub.payloads()[0]["id"]) in getattr(props, "UserProperty", [])


async def test_hostile_values_cannot_change_the_topic_levels(
    shared_mosquitto: int, validate_payload: Callable[[Any], None]
) -> None:
    prefix = f"sidecar-test/{uuid.uuid4().hex}"
    alert = hostile_alert(1)
    # Exactly three levels under the prefix, the last one the kind: a value that added a level,
    # or a wildcard the broker refused, would miss this subscription.
    async with (
        Subscriber(shared_mosquitto, prefix + "/+/+/uncertain_turn").listening() as sub,
        running(sink_config(shared_mosquitto, prefix)) as sink,
    ):
        await sink.send(alert)
        await wait_until(lambda: len(sub.messages) == 1, "the hostile alert at the subscriber")
    topic = str(sub.messages[0].topic)
    assert topic.startswith(prefix + "/")
    tenant, agent, kind = topic[len(prefix) + 1 :].split("/")
    assert (tenant, kind) == ("t%2F..%2F%23%0A%0D%7F%C2%85%3F", "uncertain_turn")
    assert agent.startswith("a%2Fb%2F%2B%2F%23%2F%00%2F%24SYS")
    validate_payload(sub.payloads()[0])


async def test_an_unreachable_broker_is_a_retryable_failure() -> None:
    async with running(sink_config(free_port(), "x", timeout_seconds=0.5)) as sink:
        with pytest.raises(AlertDeliveryError, match="no connection to the broker within"):
            await sink.send(make_alert())
        health = sink.health()
        assert not health.ready
        assert "failing" in health.detail


@pytest.mark.parametrize("qos", [1, 2])
async def test_broker_outage_then_recovery_with_the_persistent_session(
    private_mosquitto: Mosquitto, qos: Literal[1, 2], validate_payload: Callable[[Any], None]
) -> None:
    broker = private_mosquitto
    cfg = sink_config(broker.port, "alerts", timeout_seconds=1.0, session_expiry_seconds=3600, qos=qos)
    async with running(cfg) as sink:
        await wait_until(lambda: sink.health().ready, "the first connection")
        async with Subscriber(broker.port, "alerts/#").listening() as sub:
            await sink.send(make_alert(1))
            await wait_until(lambda: len(sub.messages) == 1, "the alert sent before the outage")

        broker.stop()
        with pytest.raises(AlertDeliveryError):
            await sink.send(make_alert(2))
        await wait_until(lambda: not sink.health().ready, "the sink to notice the outage")
        assert "disconnected" in sink.health().detail

        broker.start()
        await wait_until(lambda: sink.health().ready, "the reconnection")
        async with Subscriber(broker.port, "alerts/#").listening() as sub:
            await sink.send(make_alert(2))
            await sink.send(make_alert(3))
            await wait_until(lambda: len(sub.messages) == 2, "the alerts sent after the outage")
        # At least once: alert 2, first published into the outage, may also arrive a second time.
        assert sorted({p["turn"] for p in sub.payloads()}) == [2, 3]
        for payload in sub.payloads():
            validate_payload(payload)

    # Both connections asked the broker to keep the session: MQTT 5, clean start off ("c0").
    connects = [line for line in broker.log.read_text().splitlines() if cfg.client_id in line and "(p5, c0," in line]
    assert len(connects) == 2, connects


async def test_a_publish_the_broker_refuses_is_rejected(tmp_path: Path) -> None:
    acl = tmp_path / "acl"
    acl.write_text("topic readwrite allowed/#\n")
    broker = Mosquitto(tmp_path / "broker", extra_config=f"acl_file {acl}")
    broker.start()
    try:
        async with running(sink_config(broker.port, "denied")) as sink:
            with pytest.raises(AlertRejected, match="Not authorized"):
                await sink.send(make_alert())
        async with running(sink_config(broker.port, "allowed")) as sink:
            await sink.send(make_alert())
    finally:
        broker.stop()


def _self_signed(tmp_path: Path) -> tuple[Path, Path]:
    cert, key = tmp_path / "server.pem", tmp_path / "server.key"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=localhost",
            "-addext",
            "subjectAltName=DNS:localhost,IP:127.0.0.1",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
    )
    return cert, key


@pytest.fixture
def tls_broker(tmp_path: Path) -> Iterator[tuple[Mosquitto, Path]]:
    """A private broker on TLS only, with password authentication and no anonymous access."""
    cert, key = _self_signed(tmp_path)
    passwords = tmp_path / "passwd"
    passwords.write_text("")
    subprocess.run(["mosquitto_passwd", "-b", str(passwords), "sidecar", "s3cret-pw"], check=True)
    broker = Mosquitto(
        tmp_path / "broker",
        listener_options=f"certfile {cert}\nkeyfile {key}",
        extra_config=f"password_file {passwords}\nallow_anonymous false",
    )
    broker.start()
    try:
        yield broker, cert
    finally:
        broker.stop()


async def test_tls_and_password_authentication(tls_broker: tuple[Mosquitto, Path]) -> None:
    broker, cert = tls_broker
    tls = {"tls": True, "ca_file": str(cert), "username": "sidecar"}
    async with running(sink_config(broker.port, "secure", password="s3cret-pw", **tls)) as sink:
        await sink.send(make_alert())
    async with running(sink_config(broker.port, "secure", password="wrong-pw", timeout_seconds=0.5, **tls)) as sink:
        with pytest.raises(AlertDeliveryError):
            await sink.send(make_alert())
        assert not sink.health().ready
        assert "pw" not in sink.health().detail
