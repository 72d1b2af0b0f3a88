"""Alert destinations: one module per technology, each an :class:`~sidecar.alerting.sinks.base.AlertSink`.

:func:`build_sinks` makes the ones the configuration enables. Imports are lazy, so a deployment
that enables none never loads aiomqtt, the webhook signer or a second Kafka producer.
"""

from __future__ import annotations

from sidecar.alerting.config import AlertingConfig
from sidecar.alerting.sinks.base import AlertDeliveryError, AlertRejected, AlertSink
from sidecar.source.config import KafkaConfig

__all__ = ["AlertDeliveryError", "AlertRejected", "AlertSink", "build_sinks"]


def build_sinks(alerting: AlertingConfig, kafka: KafkaConfig) -> list[AlertSink]:
    """The enabled sinks, in a fixed order (MQTT, Alertmanager, webhook, Kafka); none started.

    Raises :class:`~sidecar.errors.ConfigError` for settings only usable at run time (TLS files
    the MQTT sink cannot read, a webhook secret that is not ``whsec_`` base64).
    """
    cfg = alerting.sinks
    sinks: list[AlertSink] = []
    if cfg.mqtt.enabled:
        from sidecar.alerting.sinks.mqtt import MqttAlertSink

        sinks.append(MqttAlertSink(cfg.mqtt, alerting.retry))
    if cfg.alertmanager.enabled:
        from sidecar.alerting.sinks.alertmanager import AlertmanagerAlertSink

        sinks.append(AlertmanagerAlertSink(cfg.alertmanager))
    if cfg.webhook.enabled:
        from sidecar.alerting.sinks.webhook import WebhookAlertSink

        sinks.append(WebhookAlertSink(cfg.webhook))
    if cfg.kafka.enabled:
        from sidecar.alerting.sinks.kafka import KafkaAlertSink

        sinks.append(KafkaAlertSink(cfg.kafka, kafka, alerting.retry))
    return sinks
