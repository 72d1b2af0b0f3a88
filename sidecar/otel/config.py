"""``otel.*`` settings: the OpenTelemetry ingest doors (OTLP/HTTP receiver, OTLP-on-Kafka bridge)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


TOKEN_ENV = "SIDECAR_OTEL__RECEIVER__BEARER_TOKEN"  # noqa: S105 - the variable's name, not a token


class OtlpReceiverConfig(_Frozen):
    """``POST /v1/traces`` (OTLP/HTTP, protobuf or JSON, optionally gzip).

    It writes into the events topic everything the sidecar scores and alerts on, so an enabled
    receiver requires a bearer token unless the operator opts out in so many words
    (``allow_unauthenticated``: a listener reachable only through a NetworkPolicy or a mesh that
    authenticates for it)."""

    enabled: bool = Field(False, description="Serve the OTLP/HTTP receiver.")
    host: str = Field("0.0.0.0", description="Address to bind.")  # noqa: S104 - a sidecar serves its pod
    port: int = Field(4318, ge=0, le=65535, description="Port (4318 is OTLP/HTTP's); 0 picks a free one.")
    max_body_bytes: int = Field(
        4 * 1_048_576,
        ge=1024,
        le=256 * 1_048_576,
        description="Largest request body as sent (compressed); larger ones get 413 before decoding.",
    )
    max_decompressed_bytes: int = Field(
        16 * 1_048_576,
        ge=1024,
        le=1024 * 1_048_576,
        description="Largest body after gzip decompression; a larger one gets 413 (a gzip bomb stops here).",
    )
    bearer_token: SecretStr | None = Field(
        None,
        description="When set, requests must carry 'Authorization: Bearer <token>' (else 401). "
        "Set it from a secret with SIDECAR_OTEL__RECEIVER__BEARER_TOKEN. Required when the receiver is enabled, unless "
        "allow_unauthenticated is true.",
    )
    allow_unauthenticated: bool = Field(
        False,
        description="Serve without a bearer token: any client that reaches the port can write conversations. "
        "Only for a port that something else guards (a NetworkPolicy, a mesh with mTLS); ignored when "
        "bearer_token is set.",
    )
    produce_timeout_seconds: float = Field(
        10.0,
        gt=0,
        le=300,
        description="How long a request waits for Kafka to acknowledge its events before answering 503.",
    )
    retry_after_seconds: int = Field(5, ge=1, le=3600, description="Retry-After of a 503 or 429 answer.")
    max_spans_per_request: int = Field(
        10_000,
        ge=1,
        le=1_000_000,
        description="Spans one request may hold (counted before they are parsed); more get 413 (too_many_spans). "
        "An SDK's batch is 512 spans, a Collector's 8,192 by default.",
    )
    max_work_seconds: float = Field(
        5.0,
        gt=0,
        le=300,
        description="Time one request's decoding and derivation may take (in a worker thread, off the event "
        "loop); past it the request gets 429 with Retry-After (over_budget) and nothing of it is produced.",
    )

    web_config_file: Path | None = Field(
        None,
        description="A web-config file in the Prometheus exporter-toolkit format, as for http.scrape: "
        "tls_server_config (TLS, optionally mutual) and http_server_config.headers. Authentication is "
        "bearer_token (basic_auth_users are refused here). None: plain HTTP.",
    )
    max_connections: int = Field(
        64,
        ge=1,
        le=65_536,
        description="Open connections. When all are open, the oldest idle one is closed to make room; when "
        "every one has a request in progress, one more gets 503 (over TLS: is closed) at once.",
    )
    body_timeout_seconds: float = Field(
        10.0,
        gt=0,
        le=300,
        description="Time a request body may take to arrive, plus its length at min_body_bytes_per_second; "
        "past it the request gets 408 (too_slow) and the connection is closed.",
    )
    min_body_bytes_per_second: int = Field(
        64 * 1024,
        ge=1024,
        description="The slowest upload rate a body is given time for, on top of body_timeout_seconds.",
    )
    keepalive_timeout_seconds: float = Field(
        15.0,
        gt=0,
        le=300,
        description="A connection waiting for a request (idle between requests, or its headers not finished) "
        "is closed after this long.",
    )
    max_requests_in_flight: int = Field(
        8,
        ge=1,
        le=1024,
        description="Requests accepted and not yet answered (waiting their turn, deriving or producing); one "
        "more gets 503 with Retry-After (busy) before its body is read.",
    )
    max_pending_bytes: int = Field(
        32 * 1_048_576,
        ge=1024,
        le=4096 * 1_048_576,
        description="Bytes of request bodies accepted and not yet answered (as sent; a body's announced "
        "length, or max_body_bytes when it is chunked); a request that would pass it gets 503 with "
        "Retry-After (busy) before its body is read. With Kafka down, memory stops growing here.",
    )

    @field_validator("bearer_token")
    @classmethod
    def _token_is_usable(cls, token: SecretStr | None) -> SecretStr | None:
        # The value is never echoed: the error names what is wrong with it only.
        if token is not None:
            value = token.get_secret_value()
            if not value:
                raise ValueError(f"the bearer token is empty (an unset secret?); set {TOKEN_ENV} or leave it out")
            if value != value.strip() or any(not c.isprintable() for c in value):
                raise ValueError("the bearer token has surrounding whitespace or control characters")
        return token

    @model_validator(mode="after")
    def _refuses_to_start_open(self) -> OtlpReceiverConfig:
        if self.enabled and self.bearer_token is None and not self.allow_unauthenticated:
            raise ValueError(
                f"otel.receiver is enabled without a bearer token: set one with {TOKEN_ENV} "
                "(chart: secrets.otelReceiverBearerToken), or set otel.receiver.allow_unauthenticated: true "
                "if something else guards the port"
            )
        return self


class OtlpKafkaBridgeConfig(_Frozen):
    """A consumer of the topic the Collector's ``kafka`` exporter writes."""

    enabled: bool = Field(False, description="Run the OTLP-on-Kafka bridge.")
    topic: str = Field("otlp_spans", min_length=1, max_length=249, description="The Collector's traces topic.")
    group_id: str = Field("llm-agent-sidecar-otel", min_length=1, max_length=255, description="Consumer group.")
    logs_topic: str | None = Field(
        None,
        min_length=1,
        max_length=249,
        description="The Collector's logs topic (its kafka exporter's logs.topic), for GenAI content sent as log "
        "records (instrumentations in event mode), joined to the spans of topic; None: not read.",
    )
    encoding: Literal["auto", "otlp_proto", "otlp_json"] = Field(
        "auto",
        description="The exporter's encoding; 'auto' tells them apart per record (JSON starts with '{').",
    )
    dead_letter_topic: str = Field(
        "otlp_spans.dlq",
        min_length=1,
        max_length=249,
        description="Records that cannot be decoded at all are copied here with the reason in headers. "
        "Default: <topic>.dlq.",
    )
    fetch_max_records: int = Field(200, ge=1, le=10_000, description="Records per poll (one produce+commit step).")
    max_record_bytes: int = Field(
        16 * 1_048_576, ge=1024, le=1024 * 1_048_576, description="Larger records are dead-lettered (oversized)."
    )

    @model_validator(mode="before")
    @classmethod
    def _dead_letter_topic_follows_topic(cls, data: object) -> object:
        # A bridge on another topic gets its own dead-letter topic, not otlp_spans.dlq.
        if isinstance(data, dict) and "dead_letter_topic" not in data and isinstance(data.get("topic"), str):
            return {**data, "dead_letter_topic": f"{data['topic']}.dlq"}
        return data


class OtelLimitsConfig(_Frozen):
    """What one span may hold before it is refused, whichever door it came through."""

    max_attribute_bytes: int = Field(
        4 * 1_048_576, ge=1024, description="A message attribute (a JSON text) longer than this: oversized_attribute."
    )
    max_json_depth: int = Field(32, ge=4, le=1000, description="Deeper JSON in an attribute: too_deep.")
    max_messages_per_span: int = Field(
        2_000, ge=2, le=1_000_000, description="A span whose history is longer: too_many_messages."
    )


class OtelHistoryConfig(_Frozen):
    """The per-conversation memory of what has already become events (see docs/opentelemetry.md)."""

    max_conversations: int = Field(
        100_000, ge=1, description="Conversations remembered; the least recently seen is forgotten first."
    )
    max_state_bytes: int = Field(
        64 * 1_048_576,
        ge=1_048_576,
        description="Bound on the memory the remembered histories take (16 bytes per message plus about "
        "200 per conversation); over it, the least recently seen conversation is forgotten.",
    )
    idle_ttl_seconds: float = Field(6 * 3600.0, gt=0, description="A conversation not seen for this long is forgotten.")


class OtelHoldConfig(_Frozen):
    """How long a span that cannot be decided yet is held before the decision is made anyway (see
    docs/opentelemetry.md, "Held spans"). Held spans live in memory; 0 turns a wait off."""

    parent_seconds: float = Field(
        5.0,
        ge=0,
        le=300,
        description="A model call with content but no conversation id, on it or on an ancestor read so far, waits "
        "this long for a parent span exported later (an app's parent span ends after its model calls). Past it: "
        "refused as no_conversation_id, counted in sidecar_otel_holds_total{wait=parent,outcome=expired}.",
    )
    earlier_calls_seconds: float = Field(
        5.0,
        ge=0,
        le=300,
        description="At the bridge, a model call whose input holds replies of model calls not read yet (a backlog "
        "read out of order, over several partitions and polls) waits this long for them, so each reply's event "
        "carries the span that produced it. Past it the call is derived as it is, counted in "
        "sidecar_otel_holds_total{wait=earlier_calls,outcome=expired}.",
    )
    logs_seconds: float = Field(
        5.0,
        ge=0,
        le=300,
        description="A model call without content waits this long for its content as OTLP log records "
        "(POST /v1/logs; instrumentations in event mode), and content read from log records waits as long for "
        "its span. Past it: refused as content_on_logs_not_received (log records of other spans came) or "
        "content_missing_capture_off, counted in sidecar_otel_holds_total{wait=logs,outcome=expired}.",
    )
    max_spans: int = Field(
        10_000,
        ge=1,
        le=1_000_000,
        description="Spans held at once; one more is decided at once (counted as outcome=full).",
    )


class EndMarkerConfig(_Frozen):
    """A span that ends its conversation: matched by name, by attribute, or both (all that are given)."""

    span_name: str | None = Field(None, min_length=1, max_length=256, description="The span's name, exactly.")
    attribute: str | None = Field(None, min_length=1, max_length=256, description="An attribute the span carries.")
    value: str | None = Field(
        None,
        max_length=256,
        description="The attribute's value as text (a boolean reads 'true' or 'false'); without it, any value "
        "but false, 0 and the empty string.",
    )

    @model_validator(mode="after")
    def _matches_something(self) -> EndMarkerConfig:
        if self.span_name is None and self.attribute is None:
            raise ValueError("an end marker needs a span_name, an attribute, or both")
        if self.value is not None and self.attribute is None:
            raise ValueError("an end marker's value needs its attribute")
        return self


class OtelConversationEndConfig(_Frozen):
    """Spans that end a conversation (a ``conversation_end`` event); without any, conversations end on
    the sidecar's idle TTL (``state.idle_ttl_seconds``), as native ones without an end event do."""

    markers: tuple[EndMarkerConfig, ...] = Field(
        (),
        max_length=16,
        description="The agent's own end markers, e.g. {attribute: app.conversation.ended, value: 'true'} or "
        "{span_name: conversation.end}. Put the marker in the trace of the conversation's last model call, so "
        "it is read after it (see docs/opentelemetry.md).",
    )
    root_agent_span: bool = Field(
        False,
        description="An invoke_agent span that is the root of its trace ends its conversation. Only for agents "
        "that run one agent span per conversation: with one per turn, every turn would end it.",
    )

    @property
    def enabled(self) -> bool:
        return bool(self.markers) or self.root_agent_span


class OtelConfig(_Frozen):
    """The OpenTelemetry ingest: spans in, contract-v1 events out to ``kafka.topic``. Off by default."""

    receiver: OtlpReceiverConfig = Field(default_factory=OtlpReceiverConfig)
    bridge: OtlpKafkaBridgeConfig = Field(default_factory=OtlpKafkaBridgeConfig)
    limits: OtelLimitsConfig = Field(default_factory=OtelLimitsConfig)
    history: OtelHistoryConfig = Field(default_factory=OtelHistoryConfig)
    conversation_end: OtelConversationEndConfig = Field(default_factory=OtelConversationEndConfig)
    hold: OtelHoldConfig = Field(default_factory=OtelHoldConfig)

    @property
    def enabled(self) -> bool:
        return self.receiver.enabled or self.bridge.enabled

    @model_validator(mode="after")
    def _bridge_topics_differ(self) -> OtelConfig:
        if self.bridge.topic == self.bridge.dead_letter_topic:
            raise ValueError("otel.bridge.dead_letter_topic must differ from otel.bridge.topic")
        if self.bridge.logs_topic in (self.bridge.topic, self.bridge.dead_letter_topic):
            raise ValueError("otel.bridge.logs_topic must differ from otel.bridge.topic and its dead_letter_topic")
        return self
