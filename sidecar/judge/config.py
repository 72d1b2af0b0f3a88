"""Configuration of the two-dimensional LLM judge (accuracy and completeness of goal completion).

``JudgeConfig`` is one section of the root tree (``judge``); env vars follow it, e.g.
``SIDECAR_JUDGE__LLM__BASE_URL``. The judge is a comparison baseline and an optional live scorer on
sampled traffic: it is off by default, and bounded by a call and a token budget when on.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr

StructuredOutput = Literal["json_schema", "vllm_structured_outputs", "none"]

_frozen = ConfigDict(frozen=True, extra="forbid")


class ChatEndpointConfig(BaseModel):
    """An OpenAI-compatible chat endpoint and how hard to try reaching it (one retry layer)."""

    model_config = _frozen

    base_url: str = Field("http://127.0.0.1:8000/v1", description="OpenAI-compatible API root (vLLM: http://host:port/v1).")
    model: str = Field("base", description="Model name sent in each chat request.")
    api_key: SecretStr = Field(SecretStr(""), description="Bearer token, if the endpoint wants one.")
    request_timeout_seconds: float = Field(60.0, gt=0, description="Timeout of one chat request attempt.")
    max_tokens: int = Field(512, ge=8, le=16384, description="Cap on generated tokens per answer.")
    temperature: float = Field(0.0, ge=0, le=2, description="Sampling temperature (the judge paper uses 0).")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling mass (the judge paper uses 1).")
    structured_output: StructuredOutput = Field(
        "json_schema",
        description=(
            "json_schema: response_format of type json_schema (OpenAI API, vLLM); vllm_structured_outputs: "
            "vLLM's extra_body structured_outputs.json; none: free text, validated all the same."
        ),
    )
    max_concurrency: int = Field(4, ge=1, le=256, description="Chat requests in flight at once.")
    max_attempts: int = Field(3, ge=1, le=20, description="Attempts per request on retryable failures.")
    retry_initial_backoff_seconds: float = Field(0.5, gt=0, description="First retry delay (full jitter).")
    retry_max_backoff_seconds: float = Field(10.0, gt=0, description="Cap of one retry delay.")
    retry_max_elapsed_seconds: float = Field(
        60.0, gt=0, description="Give one request this long in the retry loop, then report it unavailable."
    )
    breaker_failure_threshold: int = Field(
        5, ge=1, description="Consecutive retryable failures that open the circuit breaker."
    )
    breaker_reset_seconds: float = Field(10.0, gt=0, description="How long the breaker stays open before one probe.")


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
