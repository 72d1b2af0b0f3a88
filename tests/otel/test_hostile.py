"""Hostile and incomplete input: refused with a reason, counted per reason, never a crash."""

from __future__ import annotations

import gzip
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from sidecar.otel.config import OtelConfig
from sidecar.otel.decode import decode_traces, gunzip, sniff
from sidecar.otel.errors import REASONS, OtelRefused
from sidecar.otel.ingest import OtelIngest
from sidecar.otel.metrics import OtelMetrics
from tests.otel.conftest import refused
from tests.otel.spans import chat_attrs, conversation, encode, make_span, traces


def run(ingest: OtelIngest, attrs: dict[str, object]) -> list[tuple[bytes, bytes]]:
    data = decode_traces(encode(traces([make_span(attrs)]), "otlp_proto"), "otlp_proto", max_bytes=1 << 26)
    return ingest.derive(data, "test").records


GOOD = chat_attrs("genai", conversation(1), "c-1")


@pytest.mark.parametrize(
    ("attrs", "reason"),
    [
        # content capture off: a model call without messages
        (
            {"gen_ai.operation.name": "chat", "gen_ai.request.model": "m", "gen_ai.conversation.id": "c"},
            "content_missing_capture_off",
        ),
        ({"openinference.span.kind": "LLM", "session.id": "c"}, "content_missing_capture_off"),
        ({k: v for k, v in GOOD.items() if k != "gen_ai.conversation.id"}, "no_conversation_id"),
        (GOOD | {"gen_ai.conversation.id": "c-1\nforged-line"}, "invalid_conversation_id"),
        (GOOD | {"gen_ai.conversation.id": "x" * 1_048_576}, "invalid_conversation_id"),
        (GOOD | {"gen_ai.conversation.id": ""}, "invalid_conversation_id"),
        (GOOD | {"gen_ai.input.messages": '[{"role": "user", '}, "malformed_messages"),
        (GOOD | {"gen_ai.input.messages": '{"role": "user"}'}, "malformed_messages"),
        (GOOD | {"gen_ai.input.messages": json.dumps([{"role": "wizard", "parts": []}])}, "malformed_messages"),
        (GOOD | {"gen_ai.input.messages": "[" * 100_000 + "]" * 100_000}, "too_deep"),
        (
            GOOD
            | {
                "gen_ai.input.messages": json.dumps([{"role": "user", "parts": [{"type": "text", "content": "x"}]}])
                + " " * (5 << 20)
            },
            "oversized_attribute",
        ),
        (
            GOOD
            | {
                "gen_ai.input.messages": json.dumps(
                    [{"role": "user", "parts": [{"type": "text", "content": "x"}]}] * 10_000
                )
            },
            "too_many_messages",
        ),
        (
            GOOD
            | {
                "gen_ai.output.messages": json.dumps(
                    [{"role": "assistant", "parts": [{"type": "tool_call", "name": "f" * 500, "arguments": "{}"}]}]
                )
            },
            "contract_violation",
        ),
    ],
    ids=[
        "capture_off",
        "capture_off_oi",
        "no_id",
        "newline_id",
        "1mb_id",
        "empty_id",
        "bad_json",
        "not_list",
        "bad_role",
        "deep",
        "oversized",
        "10k_messages",
        "tool_name_too_long",
    ],
)
def test_refused_with_a_reason(
    ingest: OtelIngest, registry: CollectorRegistry, attrs: dict[str, object], reason: str
) -> None:
    assert run(ingest, attrs) == []
    assert refused(registry, reason) == 1
    assert registry.get_sample_value("sidecar_otel_spans_total", {"door": "test", "outcome": "refused"}) == 1


def test_a_refused_span_does_not_stop_the_others(ingest: OtelIngest, registry: CollectorRegistry) -> None:
    bad = make_span(GOOD | {"gen_ai.conversation.id": "a\rb"})
    good = make_span(GOOD)
    derived = ingest.derive(traces([bad, good]), "test")
    assert len(derived.records) == len(conversation(1))
    assert derived.refused == {"invalid_conversation_id": 1}


def test_deeply_nested_structured_attribute(registry: CollectorRegistry) -> None:
    # A structured value is bounded by protobuf's own nesting limit (3 message levels per kvlist
    # level), so the ingest's lower limit is checked with a lower setting.
    ingest = OtelIngest(OtelConfig(limits={"max_json_depth": 8}), OtelMetrics(registry), max_event_bytes=1 << 20)
    nested: object = "x"
    for _ in range(12):
        nested = {"k": nested}
    assert run(ingest, GOOD | {"gen_ai.input.messages": [nested]}) == []
    assert refused(registry, "too_deep") == 1


def _field(number: int, payload: bytes) -> bytes:
    """One length-delimited protobuf field, by hand (the Python API refuses to build this deep)."""
    length, n = b"", len(payload)
    while True:
        byte, n = n & 0x7F, n >> 7
        length += bytes([byte | (0x80 if n else 0)])
        if not n:
            break
    return bytes([number << 3 | 2]) + length + payload


def test_protobuf_nested_beyond_its_limit_is_invalid() -> None:
    value = _field(1, b"x")  # AnyValue{string_value}
    for _ in range(10_000):
        value = _field(5, _field(1, value))  # AnyValue{array_value: ArrayValue{values: [value]}}
    span = _field(9, _field(1, b"deep") + _field(2, value))  # Span{attributes: [KeyValue]}
    payload = _field(1, _field(2, _field(2, span)))  # TracesData{ResourceSpans{ScopeSpans{spans}}}
    with pytest.raises(OtelRefused) as exc:
        decode_traces(payload, "otlp_proto", max_bytes=1 << 24)
    assert exc.value.reason == "invalid_protobuf"


@pytest.mark.parametrize(
    ("payload", "encoding", "reason"),
    [
        (b"", "otlp_proto", "empty"),
        (b"\x0a\xff\xff\xff\xff\x0f", "otlp_proto", "invalid_protobuf"),
        (b"{not json", "otlp_json", "invalid_json"),
        (b"[1, 2]", "otlp_json", "invalid_json"),
        (b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "zz"}]}]}]}', "otlp_json", "invalid_json"),
        (b'{"resourceSpans": 7}', "otlp_json", "invalid_json"),
        (b"x" * 2000, "otlp_proto", "oversized"),
    ],
)
def test_payloads_refused(payload: bytes, encoding: str, reason: str) -> None:
    with pytest.raises(OtelRefused) as exc:
        decode_traces(payload, encoding, max_bytes=1024)  # type: ignore[arg-type]
    assert exc.value.reason == reason
    assert exc.value.reason in REASONS


def test_gzip_bomb_stops_at_the_limit() -> None:
    bomb = gzip.compress(b"\0" * (50 << 20))
    with pytest.raises(OtelRefused) as exc:
        gunzip(bomb, max_bytes=1 << 20)
    assert exc.value.reason == "oversized"
    with pytest.raises(OtelRefused) as exc:
        gunzip(b"not gzip", max_bytes=1 << 20)
    assert exc.value.reason == "invalid_gzip"
    with pytest.raises(OtelRefused) as exc:
        gunzip(gzip.compress(b"abc")[:-6], max_bytes=1 << 20)
    assert exc.value.reason == "invalid_gzip"


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(payload=st.binary(max_size=512) | st.text(max_size=300).map(str.encode))
def test_decoding_and_deriving_never_crash(ingest: OtelIngest, payload: bytes) -> None:
    try:
        data = decode_traces(payload, sniff(payload), max_bytes=1 << 20)
    except OtelRefused as exc:
        assert exc.reason in REASONS
        return
    ingest.derive(data, "test")


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    messages=st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=20),
        lambda inner: (
            st.lists(inner, max_size=4)
            | st.dictionaries(
                st.sampled_from(["role", "parts", "type", "content", "name", "arguments", "id", "response"]),
                inner,
                max_size=5,
            )
        ),
        max_leaves=30,
    )
)
def test_any_json_in_the_message_attributes_is_handled(ingest: OtelIngest, messages: object) -> None:
    attrs = GOOD | {"gen_ai.input.messages": json.dumps(messages), "gen_ai.output.messages": json.dumps(messages)}
    for _k, v in run(ingest, attrs):
        assert v  # whatever came out passed the sidecar's own decoder (checked inside derive)


def test_a_lone_surrogate_is_refused_not_raised(ingest: OtelIngest, registry: CollectorRegistry) -> None:
    inputs = '[{"role": "user", "parts": [{"type": "text", "content": "a\\ud800b"}]}]'
    assert run(ingest, GOOD | {"gen_ai.input.messages": inputs}) == []
    assert refused(registry, "malformed_messages") == 1
