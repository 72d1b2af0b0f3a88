"""``OpenAIChatClient``: chat completions from any OpenAI-compatible endpoint, with cost accounting.

The judge and the simulator's agents both talk through it. Guarantees:

* One retry layer, breaker and concurrency bound: the shared :class:`~sidecar.llm.endpoint.LlmEndpoint`
  (retryable failures retried a bounded number of times, then :class:`ChatUnavailable`; a refusal
  or an unreadable body :class:`ChatRequestError` at once, ``reason``: ``prompt_too_long``,
  ``http_400``, ``bad_response``...; while the breaker is open, calls wait for its probe).
* Every answered request's usage (prompt and completion tokens) is returned with its text, so a
  caller can account cost per conversation; a response without ``usage`` counts 0 tokens.
* Structured output is requested as configured; the text is returned as is (validation is the
  caller's job, and a malformed answer is never an exception here).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import openai
import structlog

from sidecar.llm.config import ChatEndpointConfig
from sidecar.llm.endpoint import CallObserver, Failure, LlmEndpoint
from sidecar.llm.errors import LlmRequestError, LlmUnavailable

log = structlog.get_logger()

ChatMessage = Mapping[str, str]


class ChatUnavailable(LlmUnavailable):
    """The endpoint could not be reached within one request's retry budget."""


class ChatRequestError(LlmRequestError):
    """The endpoint refused the request or answered with something unreadable."""


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


class _ChatLog(CallObserver):
    """The chat client's log events (``chat.request_refused``, ``chat.unavailable``)."""

    def __init__(self, model: str) -> None:
        self._model = model

    def failed(self, failure: Failure) -> None:
        if isinstance(failure.error, LlmRequestError):
            log.warning("chat.request_refused", model=self._model, reason=failure.error.reason)
        elif failure.final:
            log.warning("chat.unavailable", model=self._model, attempts=failure.attempts, error=str(failure.error))


class OpenAIChatClient:
    """:class:`ChatClient` over the shared :class:`~sidecar.llm.endpoint.LlmEndpoint` (see the module docstring)."""

    def __init__(self, config: ChatEndpointConfig, client: openai.AsyncOpenAI | None = None) -> None:
        """``client`` replaces the SDK client (tests pass one built on ``httpx.MockTransport``)."""
        self.config = config
        self._endpoint = LlmEndpoint(config, client=client, unavailable=ChatUnavailable, refused=ChatRequestError)
        self._client = self._endpoint.client
        self.breaker = self._endpoint.breaker
        self._log = _ChatLog(config.model)

    async def aclose(self) -> None:
        """Close connections; idempotent."""
        await self._endpoint.aclose()

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
        kwargs = self._request(messages, schema, name)
        resp = await self._endpoint.call(lambda: self._client.chat.completions.create(**kwargs), self._log)
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
