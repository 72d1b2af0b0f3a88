"""The booking agent of the end-to-end tests with the official instrumentation
(``opentelemetry-instrumentation-openai-v2``): a small fake OpenAI server that answers with a tool
call, the agent that talks to it with the ``openai`` client in one content mode, and the native
transcript of what it sent and received. The exporters are the caller's: the SDK's OTLP/HTTP
exporters to the receiver (``test_e2e_openai_v2.py``), or in-memory ones whose spans and log
records are written to Kafka as the Collector's kafka exporter writes them
(``test_e2e_bridge_events.py``)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web

TOOL_ARGS = '{"people":2}'
CONVERSATION = "conv-e2e"
AGENT = "booking"


def _completion(message: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1,
        "model": "fake",
        "choices": [
            {"index": 0, "message": message, "finish_reason": "tool_calls" if message.get("tool_calls") else "stop"}
        ],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }


async def _fake_openai(request: web.Request) -> web.Response:
    body = await request.json()
    last = body["messages"][-1]
    if last["role"] == "user" and "table" in last["content"]:
        message = {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "find_table", "arguments": TOOL_ARGS}}
            ],
        }
    elif last["role"] == "tool":
        message = {"role": "assistant", "content": "Booked table 4 for two."}
    else:
        message = {"role": "assistant", "content": "You are welcome."}
    return web.json_response(_completion(message))


@contextlib.asynccontextmanager
async def fake_openai_server() -> AsyncIterator[str]:
    """A fake OpenAI-compatible server on a free port; yields its base URL."""
    app = web.Application()
    app.router.add_post("/v1/chat/completions", _fake_openai)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}/v1"
    finally:
        await runner.cleanup()


async def run_booking_agent(
    base_url: str, mode: str, monkeypatch: pytest.MonkeyPatch, span_exporter: Any, log_exporter: Any
) -> list[dict[str, Any]]:
    """Two turns of one conversation (a tool call, its result, a reply; then a thank-you), the
    instrumentation in content ``mode``, exported in batches to the given exporters and flushed;
    returns the messages the agent sent and received, in the client's format."""
    import openai
    from opentelemetry.instrumentation.openai_v2 import OpenAIInstrumentor
    from opentelemetry.sdk._logs import LoggerProvider
    from opentelemetry.sdk._logs.export import BatchLogRecordProcessor
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    monkeypatch.setenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", mode)
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(span_exporter))
    logger_provider = LoggerProvider()
    logger_provider.add_log_record_processor(BatchLogRecordProcessor(log_exporter))
    instrumentor = OpenAIInstrumentor()
    instrumentor.instrument(tracer_provider=provider, logger_provider=logger_provider)
    client = openai.AsyncOpenAI(base_url=base_url, api_key="none", max_retries=0)
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You book tables."}]
    try:
        tracer = provider.get_tracer("agent")

        async def call() -> None:
            r = await client.chat.completions.create(model="fake", messages=messages)  # type: ignore[arg-type]
            m = r.choices[0].message
            if m.tool_calls:
                messages.append(
                    {
                        "role": "assistant",
                        "content": "",
                        "tool_calls": [
                            {
                                "id": c.id,
                                "type": "function",
                                "function": {"name": c.function.name, "arguments": c.function.arguments},  # type: ignore[union-attr]
                            }
                            for c in m.tool_calls
                        ],
                    }
                )
            else:
                messages.append({"role": "assistant", "content": m.content})

        # The agent opens one span per turn carrying the conversation id (the instrumentation does
        # not set one); the chat spans are its children.
        turn = {
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.agent.name": AGENT,
            "gen_ai.conversation.id": CONVERSATION,
        }
        with tracer.start_as_current_span(f"invoke_agent {AGENT}", attributes=turn):
            messages.append({"role": "user", "content": "A table for two tonight, please."})
            await call()
            messages.append({"role": "tool", "tool_call_id": "call_1", "content": json.dumps({"table": 4})})
            await call()
        with tracer.start_as_current_span(f"invoke_agent {AGENT}", attributes=turn):
            messages.append({"role": "user", "content": "Thanks!"})
            await call()
        assert await asyncio.to_thread(provider.force_flush, 10_000)
        assert await asyncio.to_thread(logger_provider.force_flush, 10_000)
    finally:
        await client.close()
        instrumentor.uninstrument()
        await asyncio.to_thread(provider.shutdown)
        await asyncio.to_thread(logger_provider.shutdown)
    return messages


def native_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The agent's messages as a native v1 producer sends them."""
    return [
        {
            "role": m["role"],
            "content": m["content"] or "",
            **(
                {
                    "tool_calls": [
                        {"name": c["function"]["name"], "arguments": c["function"]["arguments"]}
                        for c in m["tool_calls"]
                    ]
                }
                if m.get("tool_calls")
                else {}
            ),
        }
        for m in messages
    ]
