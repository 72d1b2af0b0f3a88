"""Alerting configuration: when a turn or a conversation escalates, and where alerts go.

``policy`` (and ``agents.<name>`` per agent, replacing it whole) says which alert kinds fire and
how: the uncertain-turn rule (relative to the agent's own recent trees by default, paper Appendix
C.2.2, calibrated to a target rate; or fixed thresholds), severities and a rate limit. ``sinks``
lists the destinations, any combination. Env vars follow the root tree, e.g.
``SIDECAR_ALERTING__SINKS__WEBHOOK__URL``.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from sidecar.alerting.alert import Severity

_frozen = ConfigDict(frozen=True, extra="forbid")
_TOPIC_FIELDS = {"agent", "kind", "severity", "tenant"}


class UncertaintyPolicyConfig(BaseModel):
    """When a response tree makes its turn "uncertain"."""

    model_config = _frozen

    mode: Literal["relative", "fixed"] = Field(
        "relative",
        description="relative: against the agent's own recent trees (flag the top target_rate under rule); "
        "fixed: min_leaves / max_best_logprob.",
    )
    rule: Literal["min_rank", "best_logprob"] = Field(
        "best_logprob",
        description="relative: the score ranked against the window. best_logprob: the rank of low best-branch "
        "logprob; min_rank: min(rank of leaves, rank of low best-branch logprob), the paper's 'top on both' (App. "
        "C.2.2). The leaf count is measured to point the wrong way (docs/alert-evaluation.md), so it is not in the "
        "default.",
    )
    target_rate: float = Field(
        0.05, gt=0, lt=1, description="relative: the fraction of an agent's trees to flag as uncertain."
    )
    window_trees: int = Field(
        500, ge=20, le=100_000, description="relative: how many of an agent's most recent trees the ranks use."
    )
    min_trees: int = Field(
        50, ge=10, description="relative: no uncertain-turn alert until the agent has this many trees."
    )
    min_leaves: int = Field(8, ge=1, description="fixed: uncertain if the tree has at least this many leaves...")
    max_best_logprob: float = Field(
        -5.0, le=0, description="fixed: ...or its most probable branch's logprob is below this."
    )

    @model_validator(mode="after")
    def _window_holds_min(self) -> UncertaintyPolicyConfig:
        if self.min_trees > self.window_trees:
            raise ValueError("min_trees must not exceed window_trees")
        return self


class PolicyConfig(BaseModel):
    """Which alert kinds fire for an agent, their severities, and a rate limit."""

    model_config = _frozen

    uncertain_turn: bool = Field(True, description="Alert on turns whose response tree is uncertain.")
    conversation_incomplete: bool = Field(
        True, description="Alert when a conversation ends and its final verdict is incomplete."
    )
    conversation_stalled: bool = Field(
        True,
        description="Alert when a conversation ends by idle timeout or lifetime with the user's message "
        "unanswered (the agent never replied).",
    )
    uncertainty: UncertaintyPolicyConfig = Field(default_factory=UncertaintyPolicyConfig)
    severity_uncertain_turn: Severity = "warning"
    severity_conversation_incomplete: Severity = "info"
    severity_conversation_stalled: Severity = "critical"
    max_alerts_per_minute: float = Field(
        60.0, ge=0, description="Per agent and process; alerts over it are suppressed and counted (0: no limit)."
    )


class RetryConfig(BaseModel):
    model_config = _frozen

    initial_backoff_seconds: float = Field(0.2, gt=0, le=60)
    max_backoff_seconds: float = Field(15.0, gt=0, le=600, description="Retries wait at most this long apart.")

    @model_validator(mode="after")
    def _ordered(self) -> RetryConfig:
        if self.max_backoff_seconds < self.initial_backoff_seconds:
            raise ValueError("max_backoff_seconds must be at least initial_backoff_seconds")
        return self


class MqttSinkConfig(BaseModel):
    """MQTT (aiomqtt): QoS 1, persistent session, one topic per agent and kind by default."""

    model_config = _frozen

    enabled: bool = False
    host: str = "127.0.0.1"
    port: int = Field(1883, ge=1, le=65535)
    protocol: Literal["5", "3.1.1"] = Field("5", description="MQTT 5 where the broker has it.")
    client_id: str = Field(
        "llm-agent-sidecar", min_length=1, max_length=64, description="Stable per replica: the session is persistent."
    )
    session_expiry_seconds: int = Field(86_400, ge=0, description="MQTT 5: how long the broker keeps the session.")
    keepalive_seconds: int = Field(30, ge=5, le=3600)
    topic_template: str = Field(
        "sidecar/alerts/{agent}/{kind}", description="Placeholders: {agent}, {kind}, {severity}, {tenant}."
    )
    qos: Literal[1, 2] = 1
    username: str | None = None
    password: SecretStr | None = None
    tls: bool = False
    ca_file: str | None = Field(None, description="PEM bundle to verify the broker (default: system CAs).")
    cert_file: str | None = Field(None, description="Client certificate (PEM) for mutual TLS.")
    key_file: str | None = Field(None, description="Client key (PEM) for mutual TLS; default: in cert_file.")
    timeout_seconds: float = Field(10.0, gt=0, le=300, description="A publish not acknowledged by then is retried.")

    @field_validator("topic_template")
    @classmethod
    def _placeholders(cls, v: str) -> str:
        names = set(re.findall(r"{([^{}]*)}", v))
        if not names <= _TOPIC_FIELDS:
            raise ValueError(f"unknown placeholders {sorted(names - _TOPIC_FIELDS)}; allowed: {sorted(_TOPIC_FIELDS)}")
        if "#" in v or "+" in v:
            raise ValueError("a publish topic cannot hold the wildcards # or +")
        return v


class AlertmanagerSinkConfig(BaseModel):
    """Alertmanager ``POST /api/v2/alerts``."""

    model_config = _frozen

    enabled: bool = False
    url: str = Field("http://127.0.0.1:9093", description="Alertmanager's root URL.")
    bearer_token: SecretStr | None = None
    resolve_after_seconds: float = Field(
        3600.0, gt=0, description="endsAt = now + this: the alert resolves by itself unless sent again."
    )
    generator_url: str | None = Field(None, description="Link shown in Alertmanager (default: the tree view).")
    timeout_seconds: float = Field(10.0, gt=0, le=300)


class WebhookSinkConfig(BaseModel):
    """A JSON POST signed per the Standard Webhooks spec (webhook-id / -timestamp / -signature)."""

    model_config = _frozen

    enabled: bool = False
    url: str = ""
    secret: SecretStr | None = Field(None, description="whsec_<base64>; alerts are unsigned without one.")
    timeout_seconds: float = Field(10.0, gt=0, le=300)

    @model_validator(mode="after")
    def _url_when_enabled(self) -> WebhookSinkConfig:
        if self.enabled and not re.match(r"https?://", self.url):
            raise ValueError("alerting.sinks.webhook.url must be an http(s) URL when the webhook sink is enabled")
        return self


class KafkaAlertSinkConfig(BaseModel):
    """A Kafka topic of alerts, on the sidecar's own Kafka connection (``kafka.*``)."""

    model_config = _frozen

    enabled: bool = False
    topic: str = Field("agent.alerts", min_length=1, max_length=249)
    timeout_seconds: float = Field(
        30.0, gt=0, le=300, description="A record not acknowledged (acks=all) by then is retried."
    )


class AlertSinksConfig(BaseModel):
    model_config = _frozen

    mqtt: MqttSinkConfig = Field(default_factory=MqttSinkConfig)
    alertmanager: AlertmanagerSinkConfig = Field(default_factory=AlertmanagerSinkConfig)
    webhook: WebhookSinkConfig = Field(default_factory=WebhookSinkConfig)
    kafka: KafkaAlertSinkConfig = Field(default_factory=KafkaAlertSinkConfig)


class FeedbackThresholdsConfig(BaseModel):
    """``alerting.feedback``: whether and how far people's feedback moves alert thresholds."""

    model_config = _frozen

    adapt_thresholds: bool = Field(
        False,
        description="Let true/false-alarm feedback move each agent's uncertain-turn target_rate within the bounds "
        "below (false: the configured thresholds, always).",
    )
    min_judged_alerts: int = Field(
        20, ge=5, le=100_000, description="Judged alerts of an agent before its threshold may move."
    )
    target_precision: float = Field(
        0.5,
        gt=0,
        lt=1,
        description="A tally precision below it makes the rule stricter (one step per target_precision x "
        "min_judged_alerts true alarms missing); at or above it, as configured.",
    )
    step: float = Field(0.2, gt=0, le=0.5, description="Each step scales the target rate by (1 - step).")
    min_rate_scale: float = Field(
        0.25, gt=0, le=1, description="The target rate never goes below this share of the configured one."
    )
    epoch: int = Field(
        0,
        ge=0,
        le=2**31 - 1,
        description="Only judgements recorded under this epoch count: raise it (on every replica) to put every "
        "threshold back and start the tallies again.",
    )
    topic: str | None = Field(
        None,
        min_length=1,
        max_length=249,
        description="The compacted topic of judgements (one row per feedback event id), followed by every "
        "replica; default <kafka.topic>.alert-feedback.",
    )
    create_topic: bool = Field(True, description="Create the topic (compacted, one partition) when it is missing.")
    replication_factor: int = Field(3, ge=1, le=32, description="Replication factor of a topic the sidecar creates.")
    max_judgements: int = Field(
        100_000,
        ge=100,
        le=10_000_000,
        description="Judgements a replica holds from the topic (about 300 bytes each); past it new ones are "
        'skipped and counted (sidecar_fleet_table_records_total{table="alert-feedback",outcome="full"}).',
    )

    def topic_name(self, source_topic: str) -> str:
        return self.topic or f"{source_topic}.alert-feedback"


class AlertingConfig(BaseModel):
    """Escalation alerts from scored effects."""

    model_config = _frozen

    enabled: bool = Field(False, description="Turn scored effects into alerts and deliver them to the sinks.")
    policy: PolicyConfig = Field(default_factory=PolicyConfig)
    agents: dict[str, PolicyConfig] = Field(
        default_factory=dict, description="Per-agent policies; agents not listed use policy."
    )
    include_text: bool = Field(
        False, description="Put the tree's most probable branch and the remaining tasks in alerts."
    )
    tree_view_base_url: str | None = Field(
        None, description="External root of this sidecar's HTTP server: alerts link to {root}/trees/{alert id}."
    )
    sinks: AlertSinksConfig = Field(default_factory=AlertSinksConfig)
    retry: RetryConfig = Field(default_factory=RetryConfig)
    feedback: FeedbackThresholdsConfig = Field(default_factory=FeedbackThresholdsConfig)

    def policy_for(self, agent: str | None) -> PolicyConfig:
        return self.agents.get(agent or "", self.policy)
