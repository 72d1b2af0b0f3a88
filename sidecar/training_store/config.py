"""Training-store configuration: where finished conversations are kept for onboarding, and how much.

Two backends: ``kafka`` (the default), one record per finished conversation in a compacted topic
that every replica writes and ``adapters onboard --source kafka-training:...`` reads whole; ``file``,
bounded JSONL directories per agent on a volume, for a single pod. A config that names a
``directory`` and no backend keeps the file store it had before the topic existed.

Env vars follow the root tree, e.g. ``SIDECAR_TRAINING_STORE__DIRECTORY``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

_frozen = ConfigDict(frozen=True, extra="forbid")
_AGENT = re.compile(r"[A-Za-z0-9_.:-]{1,64}")
EndReason = Literal["end_event", "idle_ttl", "max_lifetime", "evicted", "shutdown"]
Backend = Literal["file", "kafka"]
TOPIC_SUFFIX = ".training"


class TrainingStoreConfig(BaseModel):
    """Finished conversations in the datasets' JSON schema: a compacted Kafka topic for the whole fleet,
    or one bounded JSONL directory per agent."""

    model_config = _frozen

    enabled: bool = Field(
        False,
        description="Keep each finished conversation (already redacted when state.redaction is on) for "
        "`adapters onboard`: in the topic (backend kafka) or in directory/<agent>/ (backend file).",
    )
    backend: Backend = Field(
        "kafka",
        description="kafka: one record per conversation, key <agent>/<conversation_id>, in a compacted topic every "
        "replica writes (`--source kafka-training:...`); file: JSONL under directory, one pod's share "
        "(`--source DIR --agent NAME`). Default kafka, or file when only directory is given.",
    )
    directory: Path | None = Field(
        None, description="Backend file: root of the store (a volume the onboarding job can read)."
    )
    topic: str | None = Field(
        None,
        min_length=1,
        max_length=249,
        pattern=r"^[A-Za-z0-9._-]+$",
        description="Backend kafka: the topic; default <kafka.topic>.training.",
    )
    create_topic: bool = Field(
        True,
        description="Backend kafka: create the topic (compacted, one partition) when it is missing; off where the "
        "cluster forbids it and the operator creates it.",
    )
    replication_factor: int = Field(
        3, ge=1, le=32, description="Backend kafka: replication factor of a topic the sidecar creates."
    )
    max_record_bytes: int = Field(
        1_048_576,
        ge=4096,
        le=64 * 1_048_576,
        description="Backend kafka: a conversation whose record is larger is counted (result too_large) and "
        "skipped, never cut. The topic's max.message.bytes must allow it.",
    )
    write_timeout_seconds: float = Field(
        10.0,
        gt=0,
        le=300,
        description="Backend kafka: how long a finished conversation's effect waits for the brokers' "
        "acknowledgement before the write is counted as an error and the effect goes on.",
    )
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
    max_agents: int = Field(
        64,
        ge=1,
        description="With agents empty: at most this many agents (directories, or agents this replica writes).",
    )

    @model_validator(mode="before")
    @classmethod
    def _file_when_only_a_directory(cls, data: Any) -> Any:
        # Configs written before the kafka backend name a directory and no backend: they keep the file store.
        if isinstance(data, dict) and "backend" not in data and data.get("directory") is not None:
            return {**data, "backend": "file"}
        return data

    @field_validator("agents")
    @classmethod
    def _agent_names(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        bad = [a for a in v if not _AGENT.fullmatch(a) or a.startswith(".")]
        if bad:
            raise ValueError(f"agent names must match [A-Za-z0-9_.:-]{{1,64}} and not start with a dot: {bad}")
        return v

    @model_validator(mode="after")
    def _coherent(self) -> TrainingStoreConfig:
        if self.enabled and self.backend == "file" and self.directory is None:
            raise ValueError("training_store.directory is required when the file training store is enabled")
        if self.max_file_bytes > self.max_bytes_per_agent:
            raise ValueError("max_file_bytes must not exceed max_bytes_per_agent")
        return self

    def topic_for(self, source_topic: str) -> str:
        """The kafka backend's topic: ``topic``, or ``<source_topic>.training``."""
        return self.topic or source_topic + TOPIC_SUFFIX
