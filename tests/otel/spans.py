"""Building OTLP trace payloads the way each instrumentation writes them (with opentelemetry-proto),
and the native v1 events the same conversation would have been sent as."""

from __future__ import annotations

import base64
import itertools
import json
from collections.abc import Iterable, Sequence
from typing import Any

from google.protobuf import json_format
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span, TracesData

from sidecar.events import Event, decode_event

Msg = dict[str, Any]
DIALECTS = ("genai", "genai_old", "openinference")
_ids = itertools.count(1)


def new_id(n: int) -> bytes:
    return next(_ids).to_bytes(n, "big")


def any_value(value: Any) -> AnyValue:
    if isinstance(value, bool):
        return AnyValue(bool_value=value)
    if isinstance(value, int):
        return AnyValue(int_value=value)
    if isinstance(value, float):
        return AnyValue(double_value=value)
    if isinstance(value, str):
        return AnyValue(string_value=value)
    if isinstance(value, list):
        out = AnyValue()
        out.array_value.values.extend(any_value(v) for v in value)
        return out
    out = AnyValue()
    out.kvlist_value.values.extend(KeyValue(key=k, value=any_value(v)) for k, v in value.items())
    return out


def make_span(
    attrs: dict[str, Any],
    *,
    trace_id: bytes | None = None,
    parent: bytes = b"",
    start: int = 1_700_000_000_000_000_000,
    name: str = "chat m",
) -> Span:
    span = Span(
        trace_id=trace_id or new_id(16),
        span_id=new_id(8),
        parent_span_id=parent,
        name=name,
        start_time_unix_nano=start,
        end_time_unix_nano=start + 1_000_000,
    )
    span.attributes.extend(KeyValue(key=k, value=any_value(v)) for k, v in attrs.items())
    return span


def traces(spans: Iterable[Span]) -> TracesData:
    data = TracesData()
    rs = data.resource_spans.add()
    rs.resource.attributes.add(key="service.name", value=AnyValue(string_value="agent"))
    ss = rs.scope_spans.add()
    ss.scope.name = "test"
    ss.spans.extend(spans)
    return data


def otlp_json(data: TracesData) -> bytes:
    """OTLP JSON as the Collector and the SDKs write it: camelCase, hex trace and span ids."""
    raw = json_format.MessageToDict(data)
    for rs in raw.get("resourceSpans", []):
        for ss in rs.get("scopeSpans", []):
            for span in ss.get("spans", []):
                for key in ("traceId", "spanId", "parentSpanId"):
                    if key in span:
                        span[key] = base64.b64decode(span[key]).hex()
    return json.dumps(raw).encode()


def encode(data: TracesData, encoding: str) -> bytes:
    return data.SerializeToString() if encoding == "otlp_proto" else otlp_json(data)


# --- dialects ------------------------------------------------------------------------------


def _genai_parts(m: Msg) -> dict[str, Any]:
    if m["role"] == "tool":
        return {"role": "tool", "parts": [{"type": "tool_call_response", "id": "call_x", "result": m["content"]}]}
    parts: list[dict[str, Any]] = [{"type": "text", "content": m["content"]}] if m["content"] else []
    for c in m.get("tool_calls", []):
        parts.append({"type": "tool_call", "id": c.get("id"), "name": c["name"], "arguments": c["arguments"]})
    return {"role": m["role"], "parts": parts}


def genai_attrs(history: Sequence[Msg]) -> dict[str, Any]:
    *inputs, output = history
    attrs: dict[str, Any] = {"gen_ai.operation.name": "chat", "gen_ai.request.model": "m"}
    if inputs and inputs[0]["role"] == "system":
        attrs["gen_ai.system_instructions"] = json.dumps([{"type": "text", "content": inputs[0]["content"]}])
        inputs = inputs[1:]
    attrs["gen_ai.input.messages"] = json.dumps([_genai_parts(m) for m in inputs])
    attrs["gen_ai.output.messages"] = json.dumps([{**_genai_parts(output), "finish_reason": "stop"}])
    return attrs


def _indexed(prefix: str, m: Msg, style: str) -> dict[str, Any]:
    out: dict[str, Any] = {f"{prefix}.role": m["role"], f"{prefix}.content": m["content"]}
    for j, c in enumerate(m.get("tool_calls", [])):
        if style == "old":
            out[f"{prefix}.tool_calls.{j}.name"] = c["name"]
            out[f"{prefix}.tool_calls.{j}.arguments"] = c["arguments"]
            if c.get("id"):
                out[f"{prefix}.tool_calls.{j}.id"] = c["id"]
        else:
            out[f"{prefix}.tool_calls.{j}.tool_call.function.name"] = c["name"]
            out[f"{prefix}.tool_calls.{j}.tool_call.function.arguments"] = c["arguments"]
            if c.get("id"):
                out[f"{prefix}.tool_calls.{j}.tool_call.id"] = c["id"]
    return out


def genai_old_attrs(history: Sequence[Msg]) -> dict[str, Any]:
    *inputs, output = history
    attrs: dict[str, Any] = {"gen_ai.system": "openai", "llm.request.type": "chat"}
    for i, m in enumerate(inputs):
        attrs.update(_indexed(f"gen_ai.prompt.{i}", m, "old"))
    attrs.update(_indexed("gen_ai.completion.0", output, "old"))
    return attrs


def openinference_attrs(history: Sequence[Msg]) -> dict[str, Any]:
    *inputs, output = history
    attrs: dict[str, Any] = {"openinference.span.kind": "LLM", "llm.model_name": "m"}
    for i, m in enumerate(inputs):
        attrs.update(_indexed(f"llm.input_messages.{i}.message", m, "oi"))
    attrs.update(_indexed("llm.output_messages.0.message", output, "oi"))
    return attrs


def chat_attrs(dialect: str, history: Sequence[Msg], conversation_id: str | None) -> dict[str, Any]:
    attrs = {"genai": genai_attrs, "genai_old": genai_old_attrs, "openinference": openinference_attrs}[dialect](history)
    if conversation_id is not None:
        key = {
            "genai": "gen_ai.conversation.id",
            "genai_old": "traceloop.association.properties.session_id",
            "openinference": "session.id",
        }
        attrs[key[dialect]] = conversation_id
    return attrs


def conversation(turns: int, tag: str = "") -> list[Msg]:
    """system, then per turn: user, assistant tool call, tool result, assistant answer."""
    out: list[Msg] = [{"role": "system", "content": f"You book tables.{tag}"}]
    for t in range(turns):
        out.append({"role": "user", "content": f"turn {t}: a table for {t + 2}, please{tag}"})
        out.append(
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {
                        "name": "find_table",
                        "arguments": json.dumps({"people": t + 2}, separators=(",", ":")),
                        "id": f"call_{t}",
                    }
                ],
            }
        )
        out.append({"role": "tool", "content": json.dumps({"table": t})})
        out.append({"role": "assistant", "content": f"Booked table {t}.{tag}"})
    return out


def model_calls(history: Sequence[Msg]) -> list[list[Msg]]:
    """Each model call's full history: every prefix that ends with an assistant message."""
    return [list(history[: i + 1]) for i, m in enumerate(history) if m["role"] == "assistant"]


def native_events(conversation_id: str, history: Sequence[Msg]) -> list[Event]:
    """What a native producer sends for the same conversation, decoded by the sidecar."""
    out = []
    for seq, m in enumerate(history):
        message = {k: v for k, v in m.items() if k != "tool_calls"}
        if m.get("tool_calls"):
            message["tool_calls"] = [{"name": c["name"], "arguments": c["arguments"]} for c in m["tool_calls"]]
        value = json.dumps(
            {
                "v": 1,
                "conversation_id": conversation_id,
                "event_id": f"n-{seq}",
                "seq": seq,
                "ts": 1.0,
                "type": "message",
                "message": message,
            }
        ).encode()
        out.append(decode_event(value, conversation_id.encode(), max_bytes=1 << 20))
    return out


def decoded(records: Iterable[tuple[bytes | None, bytes]]) -> list[Event]:
    return [decode_event(v, k, max_bytes=1 << 20) for k, v in records]


def dedup(events: Iterable[Event]) -> dict[str, list[Event]]:
    """The sidecar's view: per conversation, events by seq; a re-sent event (same seq and id) is
    dropped, a different event at a taken seq or a gap is an error here."""
    out: dict[str, list[Event]] = {}
    for e in events:
        log = out.setdefault(e.conversation_id, [])
        if e.seq < len(log):
            assert log[e.seq].event_id == e.event_id, f"seq {e.seq} of {e.conversation_id} taken by another event"
            continue
        assert e.seq == len(log), f"gap in {e.conversation_id}: expected {len(log)}, got {e.seq}"
        log.append(e)
    return out
