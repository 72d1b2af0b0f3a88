"""Training-store configuration: where finished conversations are kept for onboarding, and how much.

Env vars follow the root tree, e.g. ``SIDECAR_TRAINING_STORE__DIRECTORY``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

_frozen = ConfigDict(frozen=True, extra="forbid")
_AGENT = re.compile(r"[A-Za-z0-9_.:-]{1,64}")
EndReason = Literal["end_event", "idle_ttl", "max_lifetime", "evicted", "shutdown"]


class TrainingStoreConfig(BaseModel):
    """Finished conversations written as JSONL (the datasets' schema), one bounded directory per agent."""

    model_config = _frozen

    enabled: bool = Field(
        False,
        description="Write each finished conversation (already redacted when state.redaction is on) to "
        "directory/<agent>/ for `adapters onboard --source DIR --agent NAME`.",
    )
    directory: Path | None = Field(None, description="Root of the store (a volume the onboarding job can read).")
    agents: tuple[str, ...] = Field((), description="Agents whose conversations are kept; empty: every agent.")
    max_bytes_per_agent: int = Field(
        64 * 1024 * 1024, ge=4096, description="Per agent, the oldest files are deleted past this many bytes."
    )
    max_file_bytes: int = Field(
        8 * 1024 * 1024, ge=1024, description="A file is closed and a new one started past this size (rotation)."
    )
    end_reasons: tuple[EndReason, ...] = Field(
        ("end_event", "idle_ttl"),
        description="Which endings count as finished: a conversation the sidecar cut (evicted, max_lifetime, "
        "shutdown) is not a whole conversation.",
    )
    min_user_turns: int = Field(1, ge=1, description="Conversations with fewer user messages are not kept.")
    max_agents: int = Field(64, ge=1, description="With agents empty: at most this many agent directories.")

    @field_validator("agents")
    @classmethod
    def _agent_names(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        bad = [a for a in v if not _AGENT.fullmatch(a) or a.startswith(".")]
        if bad:
            raise ValueError(f"agent names must match [A-Za-z0-9_.:-]{{1,64}} and not start with a dot: {bad}")
        return v

    @model_validator(mode="after")
    def _coherent(self) -> TrainingStoreConfig:
        if self.enabled and self.directory is None:
            raise ValueError("training_store.directory is required when the training store is enabled")
        if self.max_file_bytes > self.max_bytes_per_agent:
            raise ValueError("max_file_bytes must not exceed max_bytes_per_agent")
        return self
