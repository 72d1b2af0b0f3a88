"""OpenAIChatClient on a mock transport: request shape, structured output, usage, one retry layer,
error mapping, breaker."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx
import openai
import pytest

from sidecar.errors import PermanentError, RetryableError
from sidecar.judge.chat import ChatRequestError, ChatUnavailable, OpenAIChatClient
from sidecar.llm.config import ChatEndpointConfig

SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}


def completion(content: Any = '{"ok": true}', usage: Any = None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": "x", "object": "chat.completion", "created": 0, "model": "judge",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
    }  # fmt: skip
    body["usage"] = usage if usage is not None else {"prompt_tokens": 42, "completion_tokens": 7, "total_tokens": 49}
    return body


def client(handler: Callable[[httpx.Request], httpx.Response], **cfg: Any) -> OpenAIChatClient:
    base = {"base_url": "http://judge.test/v1", "model": "judge", "max_attempts": 3,
            "retry_initial_backoff_seconds": 0.001, "retry_max_backoff_seconds": 0.002,
            "breaker_failure_threshold": 100}  # fmt: skip
    config = ChatEndpointConfig(**{**base, **cfg})
    sdk = openai.AsyncOpenAI(base_url=config.base_url, api_key="k", max_retries=0,
                             http_client=httpx.AsyncClient(transport=httpx.MockTransport(handler)))  # fmt: skip
    return OpenAIChatClient(config, sdk)


async def test_request_shape_schema_and_usage() -> None:
    seen: list[dict[str, Any]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(json.loads(request.content))
        return httpx.Response(200, json=completion())

    c = client(handler, temperature=0.0, top_p=1.0, max_tokens=99)
    reply = await c.chat([{"role": "user", "content": "hi"}], schema=SCHEMA, name="judge_accuracy")
    assert (reply.content, reply.prompt_tokens, reply.completion_tokens) == ('{"ok": true}', 42, 7)
    body = seen[0]
    assert body["model"] == "judge" and body["max_tokens"] == 99 and body["temperature"] == 0.0 and body["top_p"] == 1.0
    expected = {"type": "json_schema", "json_schema": {"name": "judge_accuracy", "schema": SCHEMA}}
    assert body["response_format"] == expected
    await c.aclose()


async def test_vllm_structured_outputs_and_free_text_modes() -> None:
    seen: list[dict[str, Any]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(json.loads(request.content))
        return httpx.Response(200, json=completion())

    await client(handler, structured_output="vllm_structured_outputs").chat([{"role": "user", "content": "x"}],
                                                                            schema=SCHEMA)  # fmt: skip
    await client(handler, structured_output="none").chat([{"role": "user", "content": "x"}], schema=SCHEMA)
    await client(handler).chat([{"role": "user", "content": "x"}])  # no schema asked
    assert seen[0]["structured_outputs"] == {"json": SCHEMA} and "response_format" not in seen[0]
    assert "response_format" not in seen[1] and "structured_outputs" not in seen[1]
    assert "response_format" not in seen[2]


@pytest.mark.parametrize(
    ("body", "content", "tokens"),
    [
        (completion(content=None), "", (42, 7)),
        ({**completion(), "usage": None}, '{"ok": true}', (0, 0)),
        ({**completion(), "choices": []}, "", (42, 7)),
        ({"weird": 1}, "", (0, 0)),
        (completion(usage={"prompt_tokens": -3, "completion_tokens": "many"}), '{"ok": true}', (0, 0)),
    ],
)
async def test_odd_bodies_give_no_text_or_no_tokens_never_an_exception(
    body: dict[str, Any], content: str, tokens: tuple[int, int]
) -> None:
    reply = await client(lambda _r: httpx.Response(200, json=body)).chat([{"role": "user", "content": "x"}])
    assert reply.content == content and (reply.prompt_tokens, reply.completion_tokens) == tokens


async def test_unreadable_body_is_a_permanent_bad_response() -> None:
    c = client(lambda _r: httpx.Response(200, content=b"<html>", headers={"content-type": "application/json"}))
    with pytest.raises(ChatRequestError) as err:
        await c.chat([{"role": "user", "content": "x"}])
    assert err.value.reason == "bad_response"


async def test_retryable_failures_are_retried_then_succeed() -> None:
    calls = {"n": 0}

    def handler(request: httpx.Request) -> httpx.Response:
        calls["n"] += 1
        if calls["n"] == 1:
            raise httpx.ConnectError("refused", request=request)
        if calls["n"] == 2:
            return httpx.Response(503, json={"error": {"message": "overloaded"}})
        return httpx.Response(200, json=completion())

    reply = await client(handler).chat([{"role": "user", "content": "x"}])
    assert calls["n"] == 3 and reply.prompt_tokens == 42


async def test_retries_are_bounded_then_unavailable() -> None:
    calls = {"n": 0}

    def handler(request: httpx.Request) -> httpx.Response:
        calls["n"] += 1
        return httpx.Response(429, json={"error": {"message": "slow down"}})

    with pytest.raises(ChatUnavailable) as err:
        await client(handler, max_attempts=4).chat([{"role": "user", "content": "x"}])
    assert isinstance(err.value, RetryableError)
    assert calls["n"] == 4


@pytest.mark.parametrize(
    ("status", "message", "reason"),
    [
        (400, "This model's maximum context length is 2048 tokens. However, you requested 3000", "prompt_too_long"),
        (400, "bad request", "http_400"),
        (404, "no such model", "http_404"),
        (401, "unauthorized", "http_401"),
    ],
)
async def test_permanent_failures_are_not_retried(status: int, message: str, reason: str) -> None:
    calls = {"n": 0}

    def handler(request: httpx.Request) -> httpx.Response:
        calls["n"] += 1
        return httpx.Response(status, json={"error": {"message": message}})

    with pytest.raises(ChatRequestError) as err:
        await client(handler).chat([{"role": "user", "content": "x"}])
    assert isinstance(err.value, PermanentError) and err.value.reason == reason
    assert calls["n"] == 1


async def test_breaker_opens_after_consecutive_failures() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    c = client(handler, max_attempts=2, breaker_failure_threshold=2, breaker_reset_seconds=30)
    with pytest.raises(ChatUnavailable):
        await c.chat([{"role": "user", "content": "x"}])
    assert c.breaker.state == "open"
