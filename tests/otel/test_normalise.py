"""Each dialect, in both encodings, yields the events a native producer would have sent."""

from __future__ import annotations

import json

import pytest
from prometheus_client import CollectorRegistry

from sidecar.otel.config import OtelConfig
from sidecar.otel.decode import decode_traces, sniff
from sidecar.otel.ingest import OtelIngest
from sidecar.otel.metrics import OtelMetrics
from tests.otel.spans import (
    DIALECTS,
    chat_attrs,
    conversation,
    decoded,
    dedup,
    encode,
    make_span,
    model_calls,
    native_events,
    new_id,
    traces,
)


def derive(ingest: OtelIngest, payload: bytes) -> list[tuple[bytes, bytes]]:
    return ingest.derive(decode_traces(payload, sniff(payload), max_bytes=1 << 24), "test").records


@pytest.mark.parametrize("encoding", ["otlp_proto", "otlp_json"])
@pytest.mark.parametrize("dialect", DIALECTS)
def test_a_conversation_becomes_the_native_events(ingest: OtelIngest, dialect: str, encoding: str) -> None:
    history = conversation(3)
    records = []
    for i, call in enumerate(model_calls(history)):  # one trace per model call, in order
        span = make_span(chat_attrs(dialect, call, "c-1"), start=1_700_000_000_000_000_000 + i)
        records += derive(ingest, encode(traces([span]), encoding))
    events = decoded(records)
    assert [e.seq for e in events] == list(range(len(history)))  # only new suffixes, no repeats
    assert [e.message for e in events] == [e.message for e in native_events("c-1", history)]
    assert {k for k, _ in records} == {b"c-1"}


@pytest.mark.parametrize("dialect", DIALECTS)
def test_spans_in_one_payload_out_of_order_give_the_same_events(ingest: OtelIngest, dialect: str) -> None:
    history = conversation(2)
    spans = [make_span(chat_attrs(dialect, c, "c-2"), start=10 + i) for i, c in enumerate(model_calls(history))]
    events = decoded(derive(ingest, encode(traces(reversed(spans)), "otlp_proto")))
    assert [e.message for e in events] == [e.message for e in native_events("c-2", history)]


def test_the_conversation_id_and_agent_come_from_the_invoke_agent_span(ingest: OtelIngest) -> None:
    history = conversation(1)
    trace = new_id(16)
    root = make_span(
        {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "booking desk", "gen_ai.conversation.id": "c-3"},
        trace_id=trace,
        name="invoke_agent booking",
    )
    mid = make_span({"other": 1}, trace_id=trace, parent=root.span_id)
    chat = make_span(chat_attrs("genai", history, None), trace_id=trace, parent=mid.span_id)
    events = decoded(derive(ingest, encode(traces([chat, mid, root]), "otlp_json")))
    assert len(events) == len(history)
    assert {e.conversation_id for e in events} == {"c-3"}
    assert {e.agent for e in events} == {"booking_desk"}  # the contract's agent pattern


def test_openinference_agent_name_and_session(ingest: OtelIngest) -> None:
    attrs = chat_attrs("openinference", conversation(1), "s-9") | {"agent.name": "planner"}
    events = decoded(derive(ingest, encode(traces([make_span(attrs)]), "otlp_proto")))
    assert {(e.conversation_id, e.agent) for e in events} == {("s-9", "planner")}


def test_structured_attributes_and_object_arguments(ingest: OtelIngest) -> None:
    """An SDK may set the messages as a structured (kvlist/array) value and arguments as an object."""
    attrs = {
        "gen_ai.operation.name": "chat",
        "gen_ai.conversation.id": "c-4",
        "gen_ai.input.messages": [{"role": "user", "parts": [{"type": "text", "content": "hi"}]}],
        "gen_ai.output.messages": [
            {
                "role": "assistant",
                "parts": [{"type": "tool_call", "name": "f", "id": "1", "arguments": {"b": 1, "a": [1, 2]}}],
            }
        ],
    }
    events = decoded(derive(ingest, encode(traces([make_span(attrs)]), "otlp_proto")))
    assert [e.message.role for e in events if e.message] == ["user", "assistant"]
    last = events[-1].message
    assert last is not None
    assert last.tool_calls[0].arguments == '{"a":[1,2],"b":1}'


def test_tool_call_response_accepts_response_and_result(ingest: OtelIngest) -> None:
    def span(key: str, conv: str) -> bytes:
        inputs = [
            {"role": "user", "parts": [{"type": "text", "content": "q"}]},
            {"role": "tool", "parts": [{"type": "tool_call_response", "id": "1", key: {"ok": True}}]},
        ]
        attrs = {
            "gen_ai.operation.name": "chat",
            "gen_ai.conversation.id": conv,
            "gen_ai.input.messages": json.dumps(inputs),
            "gen_ai.output.messages": json.dumps([{"role": "assistant", "parts": [{"type": "text", "content": "a"}]}]),
        }
        return encode(traces([make_span(attrs)]), "otlp_proto")

    a = decoded(derive(ingest, span("response", "c-5")))
    b = decoded(derive(ingest, span("result", "c-6")))
    assert [e.message for e in a] == [e.message for e in b]
    assert a[1].message is not None
    assert a[1].message.content == '{"ok":true}'


def test_event_ids_are_a_function_of_the_span(registry: CollectorRegistry) -> None:
    payload = encode(traces([make_span(chat_attrs("genai", conversation(2), "c-7"))]), "otlp_proto")
    first = OtelIngest(OtelConfig(), OtelMetrics(registry), max_event_bytes=1 << 20)
    again = OtelIngest(OtelConfig(), OtelMetrics(CollectorRegistry()), max_event_bytes=1 << 20)
    assert derive(first, payload) == derive(again, payload)  # a restarted door derives the same records
    assert derive(first, payload) == []  # and a door that remembers derives nothing new


def test_spans_that_are_not_model_calls_are_ignored(ingest: OtelIngest, registry: CollectorRegistry) -> None:
    payload = encode(traces([make_span({"http.method": "GET"}, name="GET /")]), "otlp_proto")
    assert derive(ingest, payload) == []
    assert registry.get_sample_value("sidecar_otel_spans_total", {"door": "test", "outcome": "ignored"}) == 1


def test_one_record_many_conversations_keeps_each_in_order(ingest: OtelIngest) -> None:
    spans = []
    histories = {f"c-{i}": conversation(2, tag=str(i)) for i in range(5)}
    for cid, history in histories.items():
        spans += [make_span(chat_attrs("genai", c, cid), start=100 + j) for j, c in enumerate(model_calls(history))]
    logs = dedup(decoded(derive(ingest, encode(traces(spans), "otlp_json"))))
    for cid, history in histories.items():
        assert [e.message for e in logs[cid]] == [e.message for e in native_events(cid, history)]


def test_langfuse_session_id(ingest: OtelIngest) -> None:
    attrs = chat_attrs("genai_old", conversation(1), None) | {"langfuse.session.id": "lf-1"}
    events = decoded(derive(ingest, encode(traces([make_span(attrs)]), "otlp_proto")))
    assert {e.conversation_id for e in events} == {"lf-1"}
