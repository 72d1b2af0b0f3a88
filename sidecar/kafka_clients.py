"""Connection settings of every Kafka client in the project, in one place.

Every aiokafka consumer and producer (the source consumer and its recovery readers, the results and
dead-letter producer, the alert Kafka sink, the ``adapters`` Kafka reader, the offline tools) gets
its brokers, client id, timeouts, TLS and SASL from here and adds only its own role's settings
(offsets, batching). Producers of the sidecar's own records also take their durability settings
(acks, idempotence: the processing guarantee) from here. A structural test keeps connection and
idempotence keywords out of other modules.
"""

from __future__ import annotations

from typing import Any

from aiokafka.helpers import create_ssl_context

from sidecar.source.config import KafkaConfig


def client_kwargs(cfg: KafkaConfig, *, client_id: str | None = None) -> dict[str, Any]:
    """aiokafka keyword arguments for the sidecar's configured cluster (TLS and SASL included).

    ``client_id`` replaces ``cfg.client_id`` for a client that names its role (e.g. ``-alerts``).
    Raises ``FileNotFoundError`` for a configured CA, certificate or key file that does not exist.
    """
    kw: dict[str, Any] = {
        "bootstrap_servers": cfg.bootstrap_servers,
        "client_id": cfg.client_id if client_id is None else client_id,
        "request_timeout_ms": cfg.request_timeout_ms,
        "security_protocol": cfg.security_protocol,
    }
    if cfg.security_protocol in ("SSL", "SASL_SSL"):
        kw["ssl_context"] = create_ssl_context(
            cafile=cfg.ssl_cafile, certfile=cfg.ssl_certfile, keyfile=cfg.ssl_keyfile
        )
    if cfg.security_protocol.startswith("SASL"):
        assert cfg.sasl_password is not None  # enforced by KafkaConfig's validator
        kw["sasl_mechanism"] = cfg.sasl_mechanism
        kw["sasl_plain_username"] = cfg.sasl_username
        kw["sasl_plain_password"] = cfg.sasl_password.get_secret_value()
    return kw


def durable_producer_kwargs(cfg: KafkaConfig) -> dict[str, Any]:
    """What every producer of the sidecar's own records (results, dead letters, alerts, derived
    events) adds: ``acks=all``, and Kafka's idempotent producer under
    ``kafka.processing_guarantee: exactly_once``, so a retried batch is never written twice. Under
    ``at_least_once`` (brokers without ``InitProducerId``) it is a plain ``acks=all`` producer."""
    return {"acks": "all", "enable_idempotence": cfg.processing_guarantee == "exactly_once"}


def plaintext_client_kwargs(bootstrap_servers: str, *, client_id: str | None = None) -> dict[str, Any]:
    """aiokafka keyword arguments for brokers named by address only (a ``kafka://HOST:PORT/TOPIC`` URL,
    the demo's mock cluster): no TLS, no SASL, aiokafka's own defaults for everything else
    (its default client id too, unless ``client_id`` is given)."""
    kw: dict[str, Any] = {"bootstrap_servers": bootstrap_servers}
    if client_id is not None:
        kw["client_id"] = client_id
    return kw
