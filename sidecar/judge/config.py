"""Configuration of the two-dimensional LLM judge (accuracy and completeness of goal completion).

``JudgeConfig`` is one section of the root tree (``judge``); env vars follow it, e.g.
``SIDECAR_JUDGE__LLM__BASE_URL``. The judge is a comparison baseline and an optional live scorer on
sampled traffic: it is off by default, and bounded by a call and a token budget when on. Its
endpoint (``judge.llm``) is the shared :class:`~sidecar.llm.config.ChatEndpointConfig`.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from sidecar.llm.config import ChatEndpointConfig

_frozen = ConfigDict(frozen=True, extra="forbid")


class JudgeConfig(BaseModel):
    """The two-dimensional judge: prompts' limits, answer validation, and the optional live scorer."""

    model_config = _frozen

    enabled: bool = Field(
        False, description="Judge sampled ended conversations live (a comparison baseline; costs LLM calls)."
    )
    llm: ChatEndpointConfig = Field(default_factory=ChatEndpointConfig)
    agent_description: str = Field(
        "",
        max_length=4000,
        description="What the agent can do (its services, tools, policy in brief); shown to both judgements, "
        "as the judge paper shows its schema.",
    )
    include_system_messages: bool = Field(
        False, description="Show the agent's system messages (its instructions) to the judge."
    )
    max_message_chars: int = Field(
        2000, ge=50, le=100_000, description="Each message is cut to this many characters (head kept)."
    )
    max_transcript_chars: int = Field(
        12_000,
        ge=500,
        le=1_000_000,
        description="Over this, messages are left out of the middle (the first and the latest are kept).",
    )
    max_items: int = Field(20, ge=1, le=200, description="Items kept from one answer's incorrect/missing list.")
    max_answer_chars: int = Field(
        20_000, ge=100, le=1_000_000, description="An answer longer than this is malformed (not parsed)."
    )
    sample_rate: float = Field(
        0.05, ge=0, le=1, description="Live: fraction of ended conversations judged (deterministic per conversation)."
    )
    max_calls_per_minute: int = Field(
        60, ge=0, description="Live: chat calls per minute at most, both dimensions together (0 = unlimited)."
    )
    max_tokens_per_minute: int = Field(
        200_000, ge=0, description="Live: prompt + generated tokens per minute at most (0 = unlimited)."
    )
    max_pending: int = Field(
        16, ge=1, le=10_000, description="Live: conversations being judged at once; more are skipped (overloaded)."
    )
    include_text_in_outcome: bool = Field(
        False, description="Live: put the explanations and item lists in outcomes (they go to Kafka): off by default."
    )
