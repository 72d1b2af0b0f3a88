"""``OpenAIChatClient``: chat completions from any OpenAI-compatible endpoint, with cost accounting.

The judge and the simulator's agents both talk through it. Guarantees:

* One retry layer. The ``openai`` client's own retries are off (``max_retries=0``); retryable
  failures (connection, timeout, 5xx, 408/409/429, as :func:`sidecar.scoring.client.classify`
  decides for the scorers) are retried with the scorers' full-jitter capped backoff for at most
  ``max_attempts`` attempts and ``retry_max_elapsed_seconds``, then
  :class:`~sidecar.errors.RetryableError` is raised. Other 4xx raise
  :class:`~sidecar.errors.PermanentError` at once (``reason``: ``prompt_too_long``, ``http_400``...).
* The scorers' :class:`~sidecar.scoring.resilience.CircuitBreaker` opens after consecutive
  failures; while it is open, calls wait for its probe instead of hammering the endpoint.
* At most ``max_concurrency`` requests are in flight.
* Every answered request's usage (prompt and completion tokens) is returned with its text, so a
  caller can account cost per conversation; a response without ``usage`` counts 0 tokens.
* Structured output is requested as configured; the text is returned as is (validation is the
  caller's job, and a malformed answer is never an exception here).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import openai
import structlog

from sidecar.errors import PermanentError, RetryableError
from sidecar.judge.config import ChatEndpointConfig
from sidecar.scoring.client import classify
from sidecar.scoring.resilience import CircuitBreaker, backoff_delay

log = structlog.get_logger()

ChatMessage = Mapping[str, str]


class ChatUnavailable(RetryableError):
    """The endpoint could not be reached within one request's retry budget."""


class ChatRequestError(PermanentError):
    """The endpoint refused the request or answered with something unreadable."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


@dataclass(frozen=True, slots=True)
class ChatReply:
    """One answer: its text (possibly empty or malformed) and what it cost."""

    content: str
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str | None = None


class ChatClient(Protocol):
    """One chat completion. Implementations keep the guarantees of :class:`OpenAIChatClient`."""

    async def chat(
        self, messages: Sequence[ChatMessage], *, schema: Mapping[str, Any] | None = None, name: str = "answer"
    ) -> ChatReply:
        """The model's answer to ``messages``; ``schema`` asks for JSON of that JSON Schema."""
        ...


def _tokens(usage: Any, field: str) -> int:
    value = getattr(usage, field, None) if usage is not None else None
    return value if isinstance(value, int) and value >= 0 else 0


class OpenAIChatClient:
    """:class:`ChatClient` over ``openai.AsyncOpenAI`` (see the module docstring)."""

    def __init__(self, config: ChatEndpointConfig, client: openai.AsyncOpenAI | None = None) -> None:
        """``client`` replaces the SDK client (tests pass one built on ``httpx.MockTransport``)."""
        self.config = config
        self._client = client or openai.AsyncOpenAI(
            base_url=config.base_url,
            api_key=config.api_key.get_secret_value() or "none",
            timeout=config.request_timeout_seconds,
            max_retries=0,
        )
        self._semaphore = asyncio.Semaphore(config.max_concurrency)
        self.breaker = CircuitBreaker(config.breaker_failure_threshold, config.breaker_reset_seconds)

    async def aclose(self) -> None:
        """Close connections; idempotent."""
        await self._client.close()

    def _request(self, messages: Sequence[ChatMessage], schema: Mapping[str, Any] | None, name: str) -> dict[str, Any]:
        cfg = self.config
        kwargs: dict[str, Any] = {
            "model": cfg.model,
            "messages": [dict(m) for m in messages],
            "max_tokens": cfg.max_tokens,
            "temperature": cfg.temperature,
            "top_p": cfg.top_p,
        }
        if schema is not None and cfg.structured_output == "json_schema":
            kwargs["response_format"] = {"type": "json_schema", "json_schema": {"name": name, "schema": dict(schema)}}
        elif schema is not None and cfg.structured_output == "vllm_structured_outputs":
            kwargs["extra_body"] = {"structured_outputs": {"json": dict(schema)}}
        return kwargs

    async def chat(
        self, messages: Sequence[ChatMessage], *, schema: Mapping[str, Any] | None = None, name: str = "answer"
    ) -> ChatReply:
        cfg = self.config
        kwargs = self._request(messages, schema, name)
        started = time.monotonic()
        attempt = 0
        async with self._semaphore:
            while True:
                await self.breaker.acquire()
                try:
                    resp = await self._client.chat.completions.create(**kwargs)
                except Exception as exc:
                    error = classify(exc)
                    if error is None:
                        # A body the SDK cannot read: an APIError, or the JSON decoder's ValueError.
                        if isinstance(exc, openai.APIError | ValueError):
                            self.breaker.record_success()  # the endpoint answered: it is up
                            raise ChatRequestError("bad_response", type(exc).__name__) from exc
                        self.breaker.release_probe()
                        raise
                    if isinstance(error, PermanentError):
                        self.breaker.record_success()  # the endpoint answered: it is up
                        reason = getattr(error, "reason", "refused")
                        log.warning("chat.request_refused", model=cfg.model, reason=reason)
                        raise ChatRequestError(str(reason), "the endpoint refused the request") from exc
                    self.breaker.record_failure()
                    attempt += 1
                    elapsed = time.monotonic() - started
                    if attempt >= cfg.max_attempts or elapsed >= cfg.retry_max_elapsed_seconds:
                        log.warning("chat.unavailable", model=cfg.model, attempts=attempt, error=str(error))
                        raise ChatUnavailable(f"{attempt} attempts over {elapsed:.1f}s: {error}") from exc
                    await asyncio.sleep(
                        backoff_delay(attempt, cfg.retry_initial_backoff_seconds, cfg.retry_max_backoff_seconds)
                    )
                    continue
                except BaseException:
                    self.breaker.release_probe()
                    raise
                self.breaker.record_success()
                break
        return _reply(resp)


def _reply(resp: Any) -> ChatReply:
    """The text and usage of a completion; the SDK builds responses without validating them, so any
    shape may arrive here: a missing piece is no text or no tokens, never an exception."""
    choices = getattr(resp, "choices", None)
    choice = choices[0] if isinstance(choices, list) and choices else None
    message = getattr(choice, "message", None)
    content = getattr(message, "content", None)
    finish = getattr(choice, "finish_reason", None)
    usage = getattr(resp, "usage", None)
    return ChatReply(
        content=content if isinstance(content, str) else "",
        prompt_tokens=_tokens(usage, "prompt_tokens"),
        completion_tokens=_tokens(usage, "completion_tokens"),
        finish_reason=finish if isinstance(finish, str) else None,
    )
