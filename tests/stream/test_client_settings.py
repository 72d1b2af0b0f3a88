"""Kafka client settings: TLS and SASL options reach aiokafka; secrets stay out of reprs."""

from __future__ import annotations

import ssl

import certifi
import pytest
from pydantic import ValidationError

from sidecar.source.config import KafkaConfig
from sidecar.source.writers import client_kwargs


def test_plaintext_by_default() -> None:
    kw = client_kwargs(KafkaConfig())
    assert kw["security_protocol"] == "PLAINTEXT"
    assert "ssl_context" not in kw
    assert "sasl_plain_password" not in kw


def test_sasl_ssl_builds_context_and_credentials() -> None:
    cfg = KafkaConfig(security_protocol="SASL_SSL", ssl_cafile=certifi.where(), sasl_mechanism="SCRAM-SHA-512",
                      sasl_username="svc", sasl_password="s3cret")
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
