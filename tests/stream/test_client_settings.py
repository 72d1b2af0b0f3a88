"""Kafka client settings: TLS and SASL options reach aiokafka; secrets stay out of reprs."""

from __future__ import annotations

import ssl

import certifi
import pytest
from pydantic import ValidationError

from sidecar.kafka_clients import client_kwargs, plaintext_client_kwargs
from sidecar.source.config import KafkaConfig


def test_plaintext_by_default() -> None:
    kw = client_kwargs(KafkaConfig())
    assert kw["security_protocol"] == "PLAINTEXT"
    assert "ssl_context" not in kw
    assert "sasl_plain_password" not in kw


def test_sasl_ssl_builds_context_and_credentials() -> None:
    cfg = KafkaConfig(
        security_protocol="SASL_SSL",
        ssl_cafile=certifi.where(),
        sasl_mechanism="SCRAM-SHA-512",
        sasl_username="svc",
        sasl_password="s3cret",
    )
    kw = client_kwargs(cfg)
    assert isinstance(kw["ssl_context"], ssl.SSLContext)
    assert kw["ssl_context"].verify_mode == ssl.CERT_REQUIRED
    assert kw["sasl_mechanism"] == "SCRAM-SHA-512"
    assert kw["sasl_plain_username"] == "svc"
    assert kw["sasl_plain_password"] == "s3cret"
    assert "s3cret" not in repr(cfg)


def test_missing_ca_file_is_a_clear_error() -> None:
    with pytest.raises(FileNotFoundError):
        client_kwargs(KafkaConfig(security_protocol="SSL", ssl_cafile="/nonexistent/ca.pem"))


def test_sasl_without_credentials_is_rejected() -> None:
    with pytest.raises(ValidationError, match="sasl_mechanism"):
        KafkaConfig(security_protocol="SASL_PLAINTEXT", sasl_username="svc")


def test_a_role_may_name_its_client_and_nothing_else_changes() -> None:
    cfg = KafkaConfig(client_id="sidecar")
    assert client_kwargs(cfg, client_id="sidecar-alerts") == {**client_kwargs(cfg), "client_id": "sidecar-alerts"}


def test_brokers_named_by_address_only_get_aiokafka_defaults() -> None:
    assert plaintext_client_kwargs("h:9092") == {"bootstrap_servers": "h:9092"}
    assert plaintext_client_kwargs("h:9092", client_id="tool") == {"bootstrap_servers": "h:9092", "client_id": "tool"}
