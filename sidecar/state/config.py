"""Conversation state configuration."""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, Field, field_validator


class RedactionConfig(BaseModel):
    """Optional PII redaction, applied to every message as it enters the sidecar's state.

    Redacting on arrival covers every path text can take afterwards (scoring and clustering
    prompts, outcomes that carry text, alerts, training exports): raw text is never held.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    enabled: bool = Field(False, description="Redact PII in every message as it arrives, before anything uses it.")
    emails: bool = Field(True, description="Replace e-mail addresses.")
    phone_numbers: bool = Field(True, description="Replace phone numbers.")
    card_numbers: bool = Field(True, description="Replace payment card numbers (Luhn-checked).")
    patterns: dict[str, str] = Field(
        default_factory=dict,
        description="Extra patterns: replacement label -> regular expression (keep them linear-time: they run "
        "on every message).",
    )

    @field_validator("patterns")
    @classmethod
    def _compile(cls, v: dict[str, str]) -> dict[str, str]:
        for label, pattern in v.items():
            if not re.fullmatch(r"[A-Z][A-Z0-9_]{0,31}", label):
                raise ValueError(f"redaction label {label!r} must be UPPER_SNAKE, at most 32 chars")
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"redaction pattern for {label} does not compile: {exc}") from exc
        return v


class StateConfig(BaseModel):
    """Bounds on what the sidecar keeps in memory per partition."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    idle_ttl_seconds: float = Field(
        1800.0,
        gt=0,
        le=7 * 86400,
        description="A conversation with no event for this long is finalised as ended (idle_ttl).",
    )
    turn_debounce_seconds: float = Field(
        15.0,
        gt=0,
        le=86400,
        description="A turn whose last message is an agent reply closes after this much silence.",
    )
    max_conversations_per_partition: int = Field(
        200_000,
        ge=1,
        le=10_000_000,
        description="Over this, the least recently active conversations are finalised (evicted).",
    )
    max_memory_bytes: int = Field(
        512 * 1_048_576,
        ge=1_048_576,
        description="Process-wide bound on the memory held by conversation state (all partitions, "
        "measured as allocated object sizes, not text length): over it, partitions above their fair "
        "share finalise their least recently active conversations (evicted).",
    )
    max_conversation_bytes: int = Field(
        8 * 1_048_576,
        ge=1024,
        description="Messages that would take one conversation's state over this many bytes are "
        "dead-lettered (conversation_too_large), and so are the messages after them; the conversation keeps "
        "its prefix.",
    )
    max_messages_per_conversation: int = Field(
        2_000,
        ge=2,
        le=1_000_000,
        description="Further messages of a longer conversation are dead-lettered (conversation_too_long); "
        "its conversation_end still ends it.",
    )
    max_conversation_lifetime_seconds: float = Field(
        86_400.0,
        gt=0,
        le=30 * 86400,
        description="A conversation open this long (from its first record's Kafka timestamp) is finalised "
        "(max_lifetime) even if it is still active. Bounds how far back the commit point and the source "
        "and results topics' retention must reach.",
    )
    finished_memory: int = Field(
        20_000,
        ge=0,
        le=10_000_000,
        description="Per partition, the ids of this many most recently started finished conversations are "
        "remembered (and rebuilt after a restart), so a late or re-sent event is dead-lettered "
        "(conversation_finished) instead of reopening one.",
    )
    sweep_interval_seconds: float = Field(
        1.0, gt=0, le=3600, description="How often TTL and debounce timers are checked."
    )
    redaction: RedactionConfig = Field(default_factory=RedactionConfig)
