"""Configuration of the dual-agent simulator (``sidecar simulate``).

Two chat endpoints: the *user* agent's LLM (it also checks the assistant's summaries against the
hidden goal), and the *assistant*: either the built-in question-asking agent (an LLM with the
simulator's system prompt, after the simulator paper's QG agent) or the user's own agent behind any
OpenAI-compatible endpoint (``assistant_mode: external``), addressed with the conversation only.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from sidecar.llm.config import ChatEndpointConfig

AssistantMode = Literal["builtin", "external"]
Speaker = Literal["assistant", "user"]

DEFAULT_SUMMARY_PATTERN = r"\bsummar(?:y|ies|ise|ize|ised|ized|ising|izing)\b|^\s*={3,}\s*$"
DEFAULT_GOODBYE_PATTERN = r"\b(?:good\s?-?bye|bye|farewell)\b"


def _user_endpoint() -> ChatEndpointConfig:
    return ChatEndpointConfig(max_tokens=96)


def _assistant_endpoint() -> ChatEndpointConfig:
    return ChatEndpointConfig(max_tokens=256)


class SimulatorConfig(BaseModel):
    """How simulated conversations are made and when they end."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    user: ChatEndpointConfig = Field(default_factory=_user_endpoint, description="The user agent's LLM.")
    assistant: ChatEndpointConfig = Field(default_factory=_assistant_endpoint, description="The assistant's endpoint.")
    assistant_mode: AssistantMode = Field(
        "builtin",
        description="builtin: an LLM with the simulator's question-asking system prompt; external: the user's "
        "own agent, sent the conversation only (plus assistant_system_prompt if set).",
    )
    assistant_system_prompt: str = Field(
        "", max_length=32_000, description="Replaces the built-in assistant prompt; in external mode, sent if set."
    )
    first_speaker: Speaker = Field(
        "assistant",
        description="Who opens the conversation (the paper: the assistant greets first). An external agent "
        "without a system prompt usually needs the user to start.",
    )
    max_turns: int = Field(
        20, ge=1, le=500, description="Turn limit: user messages per conversation (the paper cut off at 20 each)."
    )
    max_user_words: int = Field(
        30, ge=1, le=1000, description="The user agent is told to answer in at most this many words."
    )
    summary_pattern: str = Field(
        DEFAULT_SUMMARY_PATTERN,
        description="An assistant message matching this (case-insensitive, multi-line) is a summary, checked "
        "against the hidden goal.",
    )
    goodbye_pattern: str = Field(
        DEFAULT_GOODBYE_PATTERN, description="A user message matching this (case-insensitive) ends the conversation."
    )
    max_goal_chars: int = Field(8000, ge=20, le=100_000, description="Longer goals are refused when loading.")
    agent: str = Field(
        "simulated", pattern=r"^[A-Za-z0-9_.:-]{1,64}$", description="The events' agent name (event contract v1)."
    )
    tenant: str | None = Field(None, max_length=128, description="The events' tenant, if any.")
    concurrency: int = Field(4, ge=1, le=1000, description="Conversations simulated at once.")
    rate: float | None = Field(None, gt=0, le=1_000_000, description="Events per second at most (none = unpaced).")

    @field_validator("summary_pattern", "goodbye_pattern")
    @classmethod
    def _compiles(cls, value: str) -> str:
        try:
            re.compile(value)
        except re.error as exc:
            raise ValueError(f"not a valid regular expression: {exc}") from None
        return value
