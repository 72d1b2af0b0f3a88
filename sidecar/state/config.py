"""Conversation state configuration."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class StateConfig(BaseModel):
    """Bounds on what the sidecar keeps in memory per partition."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    idle_ttl_seconds: float = Field(
        1800.0, gt=0, le=7 * 86400,
        description="A conversation with no event for this long is finalised as ended (idle_ttl).",
    )
    turn_debounce_seconds: float = Field(
        15.0, gt=0, le=86400,
        description="A turn whose last message is an agent reply closes after this much silence.",
    )
    max_conversations_per_partition: int = Field(
        200_000, ge=1, le=10_000_000,
        description="Over this, the least recently active conversations are finalised (evicted).",
    )
    max_memory_bytes: int = Field(
        512 * 1_048_576, ge=1_048_576,
        description="Process-wide bound on the memory held by conversation state (all partitions, "
        "measured as allocated object sizes, not text length): over it, partitions above their fair "
        "share finalise their least recently active conversations (evicted).",
    )
    max_conversation_bytes: int = Field(
        8 * 1_048_576, ge=1024,
        description="Messages that would take one conversation's state over this many bytes are "
        "dead-lettered (conversation_too_large); the conversation keeps its prefix.",
    )
    max_messages_per_conversation: int = Field(
        2_000, ge=2, le=1_000_000,
        description="Further messages of a longer conversation are dead-lettered (too_long).",
    )
    max_conversation_lifetime_seconds: float = Field(
        86_400.0, gt=0, le=30 * 86400,
        description="A conversation open this long (from its first record's Kafka timestamp) is finalised "
        "(max_lifetime) even if it is still active. Bounds how far back the commit point and the source "
        "and results topics' retention must reach.",
    )
    finished_memory: int = Field(
        20_000, ge=0, le=10_000_000,
        description="Per partition, the ids of this many most recently started finished conversations are "
        "remembered (and rebuilt after a restart), so a late or re-sent event is dead-lettered "
        "(conversation_finished) instead of reopening one.",
    )
    sweep_interval_seconds: float = Field(1.0, gt=0, le=3600,
                                          description="How often TTL and debounce timers are checked.")
