"""Tool calls through a real instrumentation: an agent using the ``openai`` client, instrumented
with ``opentelemetry-instrumentation-openai-v2``, exporting with the OTel SDK's OTLP/HTTP exporter
to the receiver. The model is a small fake OpenAI server that answers with a tool call: the suite's
vLLM model (random weights) cannot be made to call a tool, and the tool-call attributes the
instrumentation writes are the point here. The events equal a native producer's, in each content
mode: ``SPAN_ONLY`` (content on the span), ``EVENT_ONLY`` (content only as log records, exported with
the SDK's OTLP/HTTP log exporter to ``/v1/logs``) and ``SPAN_AND_EVENT`` (both). The same agent
against vLLM, with all three instrumentations, is ``test_e2e_instrumentations.py``."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry

from sidecar.otel.config import OtelConfig, OtlpReceiverConfig
from sidecar.otel.ingest import OtelIngest
from sidecar.otel.metrics import OtelMetrics
from sidecar.otel.receiver import OtlpHttpReceiver
from tests.otel.spans import decoded, dedup, native_events
from tests.otel.test_receiver import RecordingProducer

openai = pytest.importorskip("openai")
pytest.importorskip("opentelemetry.instrumentation.openai_v2")

TOOL_ARGS = '{"people":2}'


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


@pytest.fixture
async def fake_openai() -> AsyncIterator[str]:
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


@pytest.mark.parametrize("mode", ["SPAN_ONLY", "EVENT_ONLY", "SPAN_AND_EVENT"])
async def test_openai_v2_spans_become_the_native_events(
    fake_openai: str, monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.instrumentation.openai_v2 import OpenAIInstrumentor
    from opentelemetry.sdk._logs import LoggerProvider
    from opentelemetry.sdk._logs.export import BatchLogRecordProcessor
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    monkeypatch.setenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", mode)
    registry = CollectorRegistry()
    metrics = OtelMetrics(registry)
    producer = RecordingProducer()
    receiver = OtlpHttpReceiver(
        OtlpReceiverConfig(enabled=True, host="127.0.0.1", port=0, allow_unauthenticated=True),
        OtelIngest(OtelConfig(), metrics, max_event_bytes=1 << 20),
        producer,  # type: ignore[arg-type]
        metrics,
        events_topic="events",
    )
    await receiver.start()
    provider = TracerProvider()
    provider.add_span_processor(
        BatchSpanProcessor(OTLPSpanExporter(endpoint=f"http://127.0.0.1:{receiver.port}/v1/traces"))
    )
    logger_provider = LoggerProvider()
    logger_provider.add_log_record_processor(
        BatchLogRecordProcessor(OTLPLogExporter(endpoint=f"http://127.0.0.1:{receiver.port}/v1/logs"))
    )
    instrumentor = OpenAIInstrumentor()
    instrumentor.instrument(tracer_provider=provider, logger_provider=logger_provider)
    client = openai.AsyncOpenAI(base_url=fake_openai, api_key="none", max_retries=0)
    try:
        tracer = provider.get_tracer("agent")
        messages: list[dict[str, Any]] = [{"role": "system", "content": "You book tables."}]

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
                                "function": {"name": c.function.name, "arguments": c.function.arguments},
                            }
                            for c in m.tool_calls
                        ],
                    }
                )
            else:
                messages.append({"role": "assistant", "content": m.content})

        # The agent opens one span per turn carrying the conversation id (the instrumentation does
        # not set one); the chat spans are its children.
        with tracer.start_as_current_span(
            "invoke_agent booking",
            attributes={
                "gen_ai.operation.name": "invoke_agent",
                "gen_ai.agent.name": "booking",
                "gen_ai.conversation.id": "conv-e2e",
            },
        ):
            messages.append({"role": "user", "content": "A table for two tonight, please."})
            await call()
            messages.append({"role": "tool", "tool_call_id": "call_1", "content": json.dumps({"table": 4})})
            await call()
        with tracer.start_as_current_span(
            "invoke_agent booking",
            attributes={
                "gen_ai.operation.name": "invoke_agent",
                "gen_ai.conversation.id": "conv-e2e",
                "gen_ai.agent.name": "booking",
            },
        ):
            messages.append({"role": "user", "content": "Thanks!"})
            await call()
        assert await asyncio.to_thread(provider.force_flush, 10_000)
        assert await asyncio.to_thread(logger_provider.force_flush, 10_000)
    finally:
        await client.close()
        instrumentor.uninstrument()
        await asyncio.to_thread(provider.shutdown)
        await asyncio.to_thread(logger_provider.shutdown)
        await receiver.stop()

    native = [
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
    logs = dedup(decoded(producer.acked))
    assert list(logs) == ["conv-e2e"]
    assert [e.message for e in logs["conv-e2e"]] == [e.message for e in native_events("conv-e2e", native)]
    assert {e.agent for e in logs["conv-e2e"]} == {"booking"}
    # nothing refused, nothing waited in vain (in EVENT_ONLY the spans carry no content: every
    # message came from the log records)
    assert (
        registry.get_sample_value(
            "sidecar_otel_refused_total", {"door": "receiver", "reason": "content_missing_capture_off"}
        )
        is None
    )
    assert registry.get_sample_value("sidecar_otel_holds_total", {"wait": "logs", "outcome": "expired"}) is None
