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
    max_text_bytes_per_partition: int = Field(
        512 * 1_048_576, ge=1024,
        description="Over this many bytes of message text, least recently active are evicted.",
    )
    max_messages_per_conversation: int = Field(
        2_000, ge=2, le=1_000_000,
        description="Further messages of a longer conversation are dead-lettered (too_long).",
    )
    finished_memory: int = Field(
        100_000, ge=0, le=10_000_000,
        description="Ids of this many recently finished conversations are remembered, so a late or "
        "redelivered event is dead-lettered (conversation_finished) instead of reopening one.",
    )
    sweep_interval_seconds: float = Field(1.0, gt=0, le=3600,
                                          description="How often TTL and debounce timers are checked.")
