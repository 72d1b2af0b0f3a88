"""Endpoint configuration shared by every OpenAI-compatible client of the sidecar.

:class:`LlmEndpointConfig` holds what every client needs: where the endpoint is, its key, the
timeouts, the concurrency bound, the bounded retry and the circuit breaker. Each user's config
section extends it and keeps its own keys and defaults: ``scoring.vllm``
(:class:`sidecar.scoring.config.VllmEndpointConfig`), ``judge.llm`` and the simulator's ``user`` and
``assistant`` (:class:`ChatEndpointConfig`), ``clustering.llm``
(:class:`sidecar.clustering.config.ClusteringLLMConfig`). Env vars follow the root tree as before,
e.g. ``SIDECAR_JUDGE__LLM__BASE_URL``.

Validation refuses what could never work: a ``base_url`` that is not an http(s) URL with a host,
or one with whitespace or control characters (a header or log line injected through the URL); a
non-finite, zero or negative duration. The key is a ``SecretStr``, and credentials inside a URL are
masked too when the config is shown (``sidecar config``).
"""

from __future__ import annotations

from typing import Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator

StructuredOutput = Literal["json_schema", "vllm_structured_outputs", "none"]


def check_base_url(value: str) -> str:
    """``value`` if it is an http(s) URL with a host and nothing hostile in it, else ``ValueError``."""
    if any(c.isspace() or ord(c) < 0x20 or ord(c) == 0x7F for c in value):
        raise ValueError("base_url must not contain whitespace or control characters")
    parts = urlsplit(value)  # raises ValueError on a malformed host (e.g. an unclosed IPv6 bracket)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("base_url must be an http:// or https:// URL with a host")
    _ = parts.port  # raises ValueError on a port that is not a number in 0..65535
    return value


class LlmEndpointConfig(BaseModel):
    """An OpenAI-compatible endpoint and how hard to try reaching it (one retry layer).

    The defaults are the chat endpoints'; sections extend this model and override the defaults and
    bounds that differ (never the meaning).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    base_url: str = Field(
        "http://127.0.0.1:8000/v1", description="OpenAI-compatible API root, ending in /v1 (vLLM: http://host:port/v1)."
    )
    api_key: SecretStr = Field(SecretStr(""), description="Bearer token (vLLM's --api-key), if the endpoint wants one.")
    connect_timeout_seconds: float | None = Field(
        None, gt=0, allow_inf_nan=False, description="TCP connect timeout per attempt; none: request_timeout_seconds."
    )
    request_timeout_seconds: float = Field(
        60.0, gt=0, allow_inf_nan=False, description="Whole-request timeout per attempt."
    )
    max_concurrency: int = Field(4, ge=1, le=256, description="Requests in flight at once.")
    max_attempts: int = Field(3, ge=1, le=20, description="Attempts per request on retryable failures.")
    retry_initial_backoff_seconds: float = Field(
        0.5, gt=0, allow_inf_nan=False, description="First retry delay (jittered down to half)."
    )
    retry_max_backoff_seconds: float = Field(10.0, gt=0, allow_inf_nan=False, description="Cap of one retry delay.")
    retry_max_elapsed_seconds: float = Field(
        60.0,
        gt=0,
        allow_inf_nan=False,
        description="Give one request this long in the retry loop, then report it unavailable.",
    )
    breaker_failure_threshold: int = Field(
        5, ge=1, description="Consecutive retryable failures that open the circuit breaker."
    )
    breaker_reset_seconds: float = Field(
        10.0, gt=0, allow_inf_nan=False, description="How long the breaker stays open before one probe request."
    )

    @field_validator("base_url")
    @classmethod
    def _base_url(cls, value: str) -> str:
        return check_base_url(value)

    @property
    def connect_timeout(self) -> float:
        """The connect timeout in effect."""
        return self.connect_timeout_seconds or self.request_timeout_seconds


class ChatEndpointConfig(LlmEndpointConfig):
    """A chat model behind an OpenAI-compatible endpoint: the judge's and the simulator's agents'."""

    model: str = Field("base", description="Model name sent in each chat request.")
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
