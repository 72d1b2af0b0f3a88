"""Fixtures for the alert sink tests: alerts (ordinary and hostile), the schema, real destinations."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from tests.alerting.servers import Alertmanager, Mosquitto, port_open

SHARED_MQTT_PORT = 1883


@pytest.fixture(scope="session")
def alert_schema() -> dict[str, Any]:
    text = resources.files("sidecar").joinpath("schemas/alert-v1.schema.json").read_text()
    schema: dict[str, Any] = json.loads(text)
    return schema


@pytest.fixture(scope="session")
def validate_payload(alert_schema: dict[str, Any]) -> Callable[[Any], None]:
    validator = jsonschema.Draft202012Validator(alert_schema, format_checker=jsonschema.FormatChecker())

    def check(payload: Any) -> None:
        validator.validate(payload)

    return check


@pytest.fixture(scope="session")
def shared_mosquitto() -> int:
    """The machine's Mosquitto on 1883: the tests publish to it, never stop or reconfigure it."""
    if not port_open(SHARED_MQTT_PORT):
        pytest.fail("Mosquitto is not listening on 127.0.0.1:1883: mosquitto -d -c /etc/mosquitto/mosquitto.conf")
    return SHARED_MQTT_PORT


@pytest.fixture
def private_mosquitto(tmp_path: Path) -> Iterator[Mosquitto]:
    broker = Mosquitto(tmp_path / "mosquitto")
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()


@pytest.fixture(scope="module")
def alertmanager(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Alertmanager]:
    am = Alertmanager(tmp_path_factory.mktemp("alertmanager"))
    am.start()
    try:
        yield am
    finally:
        am.stop()
