"""The older GenAI dialect, messages as span events, in the shapes instrumentations write them:
attributes spread over the event, one JSON body in ``gen_ai.event.content``, content blocks as
JSON text (AWS Strands), the v1.37 attributes on an ``operation.details`` event, and the
``gen_ai.content.prompt``/``completion`` events before v1.27. Each yields the native events."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.proto.common.v1.common_pb2 import KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span
from prometheus_client import CollectorRegistry

from sidecar.otel.config import OtelConfig
from sidecar.otel.dialects import Limits
from sidecar.otel.errors import OtelRefused
from sidecar.otel.ingest import OtelIngest
from sidecar.otel.metrics import OtelMetrics
from sidecar.otel.span_events import read_event_history
from tests.otel.spans import (
    Msg,
    any_value,
    conversation,
    decoded,
    genai_attrs,
    make_span,
    model_calls,
    native_events,
    traces,
)

MODEL_CALL = {"gen_ai.operation.name": "chat", "gen_ai.system": "openai", "gen_ai.conversation.id": "ev-1"}
LIMITS = Limits(4096, 16, 50)


def with_events(attrs: dict[str, Any], events: Sequence[tuple[str, dict[str, Any]]], start: int = 10) -> Span:
    span = make_span(attrs, start=start)
    for i, (name, event_attrs) in enumerate(events):
        e = span.events.add(name=name, time_unix_nano=start + i)
        e.attributes.extend(KeyValue(key=k, value=any_value(v)) for k, v in event_attrs.items())
    return span


def _openai_calls(m: Msg) -> list[dict[str, Any]]:
    return [
        {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
        for c in m.get("tool_calls", [])
    ]


def spread(history: Sequence[Msg]) -> list[tuple[str, dict[str, Any]]]:
    """Body fields as event attributes; the choice's message a JSON text (OpenLLMetry's event mode)."""
    *inputs, output = history
    out: list[tuple[str, dict[str, Any]]] = []
    for m in inputs:
        attrs: dict[str, Any] = {"gen_ai.system": "openai", "content": m["content"]}
        if m.get("tool_calls"):
            attrs["tool_calls"] = json.dumps(_openai_calls(m))
        if m["role"] == "tool":
            attrs["id"] = "call_x"
        out.append((f"gen_ai.{m['role']}.message", attrs))
    message = {"role": "assistant", "content": output["content"], "tool_calls": _openai_calls(output)}
    out.append(("gen_ai.choice", {"index": 0, "finish_reason": "stop", "message": json.dumps(message)}))
    return out


def event_content(history: Sequence[Msg]) -> list[tuple[str, dict[str, Any]]]:
    """The whole body as one JSON object in gen_ai.event.content (Azure AI Inference)."""
    *inputs, output = history
    out = [
        (f"gen_ai.{m['role']}.message", {"gen_ai.event.content": json.dumps({"role": m["role"], **_body(m)})})
        for m in inputs
    ]
    choice = {"index": 0, "finish_reason": "stop", "message": _body(output)}
    return [*out, ("gen_ai.choice", {"gen_ai.event.content": json.dumps(choice)})]


def _body(m: Msg) -> dict[str, Any]:
    body: dict[str, Any] = {"content": m["content"]}
    if m.get("tool_calls"):
        body["tool_calls"] = _openai_calls(m)
    return body


def strands(history: Sequence[Msg]) -> list[tuple[str, dict[str, Any]]]:
    """Bedrock Converse content blocks serialised as JSON text (AWS Strands)."""

    def blocks(m: Msg) -> list[dict[str, Any]]:
        if m["role"] == "tool":
            return [{"toolResult": {"toolUseId": "call_x", "status": "success", "content": [{"text": m["content"]}]}}]
        out: list[dict[str, Any]] = [{"text": m["content"]}] if m["content"] else []
        for c in m.get("tool_calls", []):
            out.append({"toolUse": {"toolUseId": c["id"], "name": c["name"], "input": json.loads(c["arguments"])}})
        return out

    *inputs, output = history
    out = [(f"gen_ai.{m['role']}.message", {"content": json.dumps(blocks(m))}) for m in inputs]
    return [*out, ("gen_ai.choice", {"finish_reason": "end_turn", "message": json.dumps(blocks(output))})]


def details(history: Sequence[Msg]) -> list[tuple[str, dict[str, Any]]]:
    """The v1.37 JSON attributes on one event."""
    attrs = genai_attrs(history)
    return [("gen_ai.client.inference.operation.details", {k: v for k, v in attrs.items() if k.startswith("gen_ai.")})]


def old_content(history: Sequence[Msg]) -> list[tuple[str, dict[str, Any]]]:
    *inputs, output = history
    return [
        ("gen_ai.content.prompt", {"gen_ai.prompt": json.dumps([{"role": m["role"], **_body(m)} for m in inputs])}),
        ("gen_ai.content.completion", {"gen_ai.completion": json.dumps([{"role": "assistant", **_body(output)}])}),
    ]


SHAPES: dict[str, Callable[[Sequence[Msg]], list[tuple[str, dict[str, Any]]]]] = {
    "spread": spread,
    "event_content": event_content,
    "strands": strands,
    "details": details,
    "old_content": old_content,
}


def ingest() -> OtelIngest:
    return OtelIngest(OtelConfig(), OtelMetrics(CollectorRegistry()), max_event_bytes=1 << 20)


@pytest.mark.parametrize("shape", SHAPES)
def test_message_events_become_the_native_events(shape: str) -> None:
    door = ingest()
    history = conversation(2)
    records = []
    for i, call in enumerate(model_calls(history)):
        span = with_events(MODEL_CALL, SHAPES[shape](call), start=100 * i)
        records += door.derive(traces([span]), "test").records
    events = decoded(records)
    assert [e.message for e in events] == [e.message for e in native_events("ev-1", history)]


def test_only_the_first_choice_is_a_turn() -> None:
    history = conversation(1)[:2]
    second = ("gen_ai.choice", {"index": 1, "message": json.dumps({"content": "another sample"})})
    span = with_events(MODEL_CALL, [*spread([*history, {"role": "assistant", "content": "ok"}]), second])
    got = read_event_history(span, LIMITS)
    assert got is not None
    assert [m.content for m in got] == [m["content"] for m in history] + ["ok"]


def test_an_agent_span_with_message_events_is_not_a_model_call() -> None:
    agent = {"gen_ai.operation.name": "invoke_agent", "gen_ai.conversation.id": "ev-2"}
    span = with_events(agent, spread(conversation(1)))
    derived = ingest().derive(traces([span]), "test")
    assert derived.records == [] and derived.rejected_spans == 0


def test_a_span_without_message_events_reads_as_before() -> None:
    span = with_events(MODEL_CALL, [("exception", {"exception.message": "x"})])
    assert read_event_history(span, LIMITS) is None
    door = ingest()
    assert door.derive(traces([span]), "test").refused == {}  # it waits for its content as log records
    derived = door.derive([], "test", now=math.inf)
    assert derived.refused == {"content_missing_capture_off": 1}  # a model call, its content not captured


@pytest.mark.parametrize(
    ("events", "reason"),
    [
        ([("gen_ai.user.message", {"content": "x" * 5000})], "oversized_attribute"),
        ([("gen_ai.user.message", {"gen_ai.event.content": "[" * 40 + "]" * 40})], "too_deep"),
        ([("gen_ai.user.message", {"role": "wizard", "content": "x"})], "malformed_messages"),
        ([("gen_ai.assistant.message", {"tool_calls": '[{"function": {}}]'})], "malformed_messages"),
        ([("gen_ai.assistant.message", {"tool_calls": '{"not": "a list"}'})], "malformed_messages"),
        ([("gen_ai.user.message", {"content": {"no": "text"}})], "malformed_messages"),
        ([("gen_ai.content.prompt", {"gen_ai.prompt": '{"not": "a list"}'})], "malformed_messages"),
        ([("gen_ai.content.prompt", {"gen_ai.prompt": '[{"content": "no role"}]'})], "malformed_messages"),
        ([("gen_ai.user.message", {"content": "x"})] * 60, "too_many_messages"),
    ],
)
def test_hostile_events_are_refused_with_a_reason(events: list[tuple[str, dict[str, Any]]], reason: str) -> None:
    with pytest.raises(OtelRefused) as err:
        read_event_history(with_events(MODEL_CALL, events), LIMITS)
    assert err.value.reason == reason


EVENT_NAMES = [
    "gen_ai.user.message",
    "gen_ai.assistant.message",
    "gen_ai.tool.message",
    "gen_ai.choice",
    "gen_ai.content.prompt",
    "gen_ai.client.inference.operation.details",
]
KEYS = ["content", "role", "tool_calls", "message", "index", "id", "gen_ai.event.content", "gen_ai.prompt",
        "gen_ai.input.messages"]  # fmt: skip
_SCALARS = st.one_of(st.text(max_size=30), st.integers(-(2**63), 2**63 - 1), st.booleans())
_JSONISH = st.recursive(
    _SCALARS | st.none(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)
# an attribute value: a scalar, or JSON text of any JSON value (as most instrumentations write them)
_VALUES = _SCALARS | _JSONISH.map(json.dumps)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(EVENT_NAMES), st.dictionaries(st.sampled_from(KEYS), _VALUES)), max_size=6))
def test_any_event_attributes_give_messages_or_a_refusal(events: list[tuple[str, dict[str, Any]]]) -> None:
    try:
        got = read_event_history(with_events(MODEL_CALL, events), LIMITS)
    except OtelRefused:
        return
    for m in got or []:
        m.digest()  # a message the contract can carry (or a refusal from it, never another error)


def test_streamed_chunk_events_are_not_messages() -> None:
    chunks = [("gen_ai.content.completion.chunk", {})] * 3  # OpenLLMetry, one per streamed chunk
    assert read_event_history(with_events(MODEL_CALL, chunks), LIMITS) is None
