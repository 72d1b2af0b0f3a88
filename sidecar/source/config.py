"""Kafka source configuration."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator


class KafkaConfig(BaseModel):
    """Where conversation events come from and where results and rejects go."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    bootstrap_servers: str = Field(
        "localhost:9092", min_length=1, description="Comma-separated host:port list of Kafka brokers."
    )
    topic: str = Field(
        "agent.conversations",
        min_length=1,
        max_length=249,
        description="Topic carrying conversation events (event contract v1).",
    )
    group_id: str = Field("llm-agent-sidecar", min_length=1, description="Consumer group id.")
    client_id: str = Field("llm-agent-sidecar", min_length=1, description="Client id sent to the brokers.")
    dead_letter_topic: str = Field(
        "agent.conversations.dlq",
        min_length=1,
        max_length=249,
        description="Rejected records go here, value untouched, the reason in headers.",
    )
    results_topic: str = Field(
        "agent.conversations.sidecar-results",
        min_length=1,
        max_length=249,
        description="One record per hook outcome; also the exactly-once journal read back on restart.",
    )
    processing_guarantee: Literal["exactly_once", "at_least_once"] = Field(
        "exactly_once",
        description="exactly_once: every hook outcome is written to the results topic once (idempotent "
        "producer); the sidecar refuses to start when the brokers cannot give it. at_least_once: for "
        "Kafka-compatible brokers without an idempotent producer; results and dead-letter records can "
        "then be written twice after a producer retry, while hook effects and alerts still happen once "
        "(docs/guarantees.md).",
    )
    auto_offset_reset: Literal["earliest", "latest"] = Field(
        "earliest", description="Where a partition with no committed offset starts."
    )
    max_record_bytes: int = Field(
        1_048_576,
        ge=1024,
        le=100 * 1_048_576,
        description="Records with a larger value are dead-lettered as 'oversized'.",
    )
    fetch_max_records: int = Field(500, ge=1, le=100_000, description="Records per poll.")
    fetch_max_bytes: int = Field(
        16 * 1_048_576,
        ge=1_048_576,
        le=1024 * 1_048_576,
        description="Most bytes the consumer prefetches per fetch (the Kafka client's own buffer).",
    )
    max_queued_bytes_per_partition: int = Field(
        8 * 1_048_576,
        ge=65_536,
        description="Fetched bytes buffered per partition before the partition is paused.",
    )
    partition_queue_batches: int = Field(
        4,
        ge=1,
        le=1000,
        description="Fetched batches buffered per partition before the partition is paused.",
    )
    max_pending_effects_per_partition: int = Field(
        256,
        ge=1,
        le=1_000_000,
        description="Hook calls in flight per partition before the partition stops reading.",
    )
    revoke_grace_seconds: float = Field(
        5.0,
        ge=0,
        le=600,
        description="On revoke or shutdown, pending effects get this long to finish; the rest fire again at "
        "the partition's next owner. Keep it well under max_poll_interval_ms (a rebalance waits for it) "
        "and under the pod's termination grace period.",
    )
    revoke_flush_timeout_seconds: float = Field(
        10.0,
        gt=0,
        le=600,
        description="On revoke or shutdown, how long to wait for journal writes already sent to be "
        "acknowledged before the partition is given up, and then for its final offset commit (a commit "
        "not answered by then is dropped: the next owner starts from the previous one).",
    )
    commit_interval_seconds: float = Field(1.0, gt=0, le=300, description="How often offsets are committed.")
    session_timeout_ms: int = Field(
        45_000, ge=6_000, le=1_800_000, description="Group session timeout: a dead replica's partitions move after it."
    )
    heartbeat_interval_ms: int = Field(3_000, ge=100, le=60_000, description="At most a third of the session timeout.")
    max_poll_interval_ms: int = Field(
        300_000, ge=10_000, le=3_600_000, description="Upper bound between polls; the fetch loop never blocks on hooks."
    )
    request_timeout_ms: int = Field(40_000, ge=1_000, le=600_000, description="Kafka request timeout.")
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = Field(
        "PLAINTEXT", description="Transport security towards the brokers."
    )
    ssl_cafile: str | None = Field(None, description="CA bundle (PEM) to verify the brokers.")
    ssl_certfile: str | None = Field(None, description="Client certificate (PEM) for mutual TLS.")
    ssl_keyfile: str | None = Field(None, description="Client key (PEM) for mutual TLS.")
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] | None = Field(
        None, description="SASL mechanism when security_protocol is SASL_*."
    )
    sasl_username: str | None = Field(None, description="SASL user name.")
    sasl_password: SecretStr | None = Field(None, description="SASL password; masked in `config show` and logs.")
    journal_signing_keys: list[SecretStr] = Field(
        default_factory=list,
        max_length=8,
        description="HMAC keys for results records: the first signs, any verifies (rotation). When set, "
        "recovery ignores results records without a valid signature, so a producer that can write the "
        "results topic cannot suppress hooks or end conversations.",
    )
    ready_requires_partitions: bool = Field(
        False,
        description="Report not ready while no partition is assigned. Off: a standby replica (more replicas "
        "than partitions) is ready, so rolling updates proceed.",
    )

    @model_validator(mode="after")
    def _check(self) -> KafkaConfig:
        if self.heartbeat_interval_ms * 3 > self.session_timeout_ms:
            raise ValueError("heartbeat_interval_ms must be at most a third of session_timeout_ms")
        sasl = self.security_protocol.startswith("SASL")
        if sasl and (self.sasl_mechanism is None or not self.sasl_username or self.sasl_password is None):
            raise ValueError(
                f"security_protocol={self.security_protocol} needs sasl_mechanism, sasl_username and sasl_password"
            )
        if len({self.topic, self.dead_letter_topic, self.results_topic}) != 3:
            raise ValueError("topic, dead_letter_topic and results_topic must be three different topics")
        return self
