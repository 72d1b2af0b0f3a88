"""Read one span's message history, whichever instrumentation wrote it.

Dialects, tried in this order (the first one present wins):

* **GenAI semantic conventions v1.37+**: JSON attributes ``gen_ai.system_instructions`` (parts),
  ``gen_ai.input.messages`` and ``gen_ai.output.messages`` (``{role, parts: [...]}`` with ``text``,
  ``tool_call`` and ``tool_call_response`` parts; a response is ``response`` or ``result``). The
  attribute may be a JSON text or a structured (array/kvlist) attribute value.
* **GenAI before v1.37** (OpenLLMetry's bedrock, litellm, watsonx and others):
  ``gen_ai.prompt.{i}.role/content/tool_calls.{j}.*`` and ``gen_ai.completion.{i}.*``.
* **OpenInference**: ``llm.input_messages.{i}.message.role/content/contents.{k}.message_content.text/
  tool_calls.{j}.tool_call.function.name|arguments/tool_call.id/tool_call_id/name`` and
  ``llm.output_messages.{i}.message.*``.

Only the first choice of the output is kept (``n > 1`` samples are alternatives, not turns). Parts
other than text and tool calls (reasoning, blobs, URIs) are not part of the transcript.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from sidecar.otel.errors import OtelRefused
from sidecar.otel.messages import OtelMessage, OtelToolCall, canonical_json, check_depth, role_of

Attributes = Mapping[str, AnyValue]

GENAI_INPUT = "gen_ai.input.messages"
GENAI_OUTPUT = "gen_ai.output.messages"
GENAI_SYSTEM = "gen_ai.system_instructions"

# Operations whose spans carry messages that are a conversation's turns. invoke_agent and
# execute_tool spans may repeat parts of them (an agent's final answer); they are read for the
# conversation id and agent name only.
NOT_CHAT_OPERATIONS = frozenset({"invoke_agent", "create_agent", "execute_tool", "embeddings"})

_INDEXED_GENAI = re.compile(r"gen_ai\.(prompt|completion)\.(\d{1,7})\.(.+)")
_INDEXED_OPENINFERENCE = re.compile(r"llm\.(input|output)_messages\.(\d{1,7})\.message\.(.+)")
_TOOL_CALL_OLD = re.compile(r"tool_calls\.(\d{1,4})\.(name|arguments|id)")
_TOOL_CALL_OI = re.compile(r"tool_calls\.(\d{1,4})\.tool_call\.(function\.name|function\.arguments|id)")
_CONTENTS_OI = re.compile(r"contents\.(\d{1,4})\.message_content\.text")


class Limits:
    """The per-span bounds (``otel.limits``), as plain attributes for the hot path."""

    __slots__ = ("max_attribute_bytes", "max_json_depth", "max_messages")

    def __init__(self, max_attribute_bytes: int, max_json_depth: int, max_messages: int) -> None:
        self.max_attribute_bytes = max_attribute_bytes
        self.max_json_depth = max_json_depth
        self.max_messages = max_messages


def string_attr(attrs: Attributes, key: str) -> str | None:
    """A string (or integer) attribute as text; ``None`` when absent or of another type."""
    value = attrs.get(key)
    if value is None:
        return None
    kind = value.WhichOneof("value")
    if kind == "string_value":
        return value.string_value
    if kind == "int_value":
        return str(value.int_value)
    return None


def is_llm_span(attrs: Attributes) -> bool:
    """Whether the span is a model call by any dialect's marker (used to tell 'capture off' apart
    from spans that never had messages)."""
    op = string_attr(attrs, "gen_ai.operation.name")
    if op is not None:
        return op not in NOT_CHAT_OPERATIONS
    kind = string_attr(attrs, "openinference.span.kind")
    if kind is not None:
        return kind.upper() == "LLM"
    return "gen_ai.request.model" in attrs or "llm.model_name" in attrs or "llm.request.type" in attrs


def read_history(attrs: Attributes, limits: Limits) -> list[OtelMessage] | None:
    """The span's history (input then the first output message), or ``None`` if it carries none.

    Raises :class:`OtelRefused` for malformed, oversized or too deeply nested content."""
    op = string_attr(attrs, "gen_ai.operation.name")
    if op in NOT_CHAT_OPERATIONS:
        return None
    if GENAI_INPUT in attrs or GENAI_OUTPUT in attrs:
        history = genai_history(attrs, limits)
    elif "llm.input_messages.0.message.role" in attrs or "llm.output_messages.0.message.role" in attrs:
        history = _indexed(attrs, limits, _INDEXED_OPENINFERENCE, ("input", "output"))
    elif "gen_ai.prompt.0.role" in attrs or "gen_ai.prompt.0.content" in attrs or "gen_ai.completion.0.role" in attrs:
        history = _indexed(attrs, limits, _INDEXED_GENAI, ("prompt", "completion"))
    else:
        return None
    if len(history) > limits.max_messages:
        raise OtelRefused("too_many_messages", f"{len(history)} messages; the limit is {limits.max_messages}")
    return history


# --- GenAI v1.37+ ----------------------------------------------------------------------------


def _json_attr(attrs: Attributes, key: str, limits: Limits) -> Any:
    value = attrs.get(key)
    if value is None:
        return None
    if value.WhichOneof("value") == "string_value":
        text = value.string_value
        if len(text) > limits.max_attribute_bytes:
            raise OtelRefused("oversized_attribute", f"{key} is over {limits.max_attribute_bytes} bytes")
        try:
            parsed = json.loads(text)
        except RecursionError:
            raise OtelRefused("too_deep", f"{key} is nested too deeply") from None
        except ValueError:
            raise OtelRefused("malformed_messages", f"{key} is not valid JSON") from None
    else:
        if value.ByteSize() > limits.max_attribute_bytes:
            raise OtelRefused("oversized_attribute", f"{key} is over {limits.max_attribute_bytes} bytes")
        parsed = any_value(value, limits.max_json_depth)
    check_depth(parsed, limits.max_json_depth)
    return parsed


def any_value(value: AnyValue, max_depth: int, depth: int = 1) -> Any:
    """A structured attribute value as plain Python data (kvlists become dicts), depth-bounded."""
    if depth > max_depth:
        raise OtelRefused("too_deep", f"attribute value nested deeper than {max_depth} levels")
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [any_value(v, max_depth, depth + 1) for v in value.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: any_value(kv.value, max_depth, depth + 1) for kv in value.kvlist_value.values}
    if kind == "bytes_value":
        return value.bytes_value.hex()
    return getattr(value, kind) if kind is not None else None


def genai_history(attrs: Attributes, limits: Limits) -> list[OtelMessage]:
    history: list[OtelMessage] = []
    system = _json_attr(attrs, GENAI_SYSTEM, limits)
    if system is not None:
        parts = system if isinstance(system, list) else [system]
        text, _ = genai_parts(parts, limits)
        history.append(OtelMessage("system", text))
    inputs = _json_attr(attrs, GENAI_INPUT, limits)
    outputs = _json_attr(attrs, GENAI_OUTPUT, limits)
    for raw, what in ((inputs, "input"), (outputs, "output")):
        if raw is not None and not isinstance(raw, list):
            raise OtelRefused("malformed_messages", f"gen_ai.{what}.messages is not a list")
    if inputs and len(inputs) + len(history) > limits.max_messages:
        raise OtelRefused("too_many_messages", f"over {limits.max_messages} messages")
    for m in inputs or []:
        message = _genai_message(m, limits)
        # Some instrumentations send the system prompt both ways: keep one copy.
        if not (history and len(history) == 1 and message.role == "system" and message == history[0]):
            history.append(message)
    if outputs:
        history.append(_genai_message(outputs[0], limits))
    return history


def _genai_message(m: object, limits: Limits) -> OtelMessage:
    if not isinstance(m, dict):
        raise OtelRefused("malformed_messages", "a message is not an object")
    role = role_of(m.get("role"))
    parts = m.get("parts")
    if parts is None and isinstance(m.get("content"), str):  # a plain {role, content} message
        parts = [{"type": "text", "content": m["content"]}]
    if not isinstance(parts, list):
        raise OtelRefused("malformed_messages", "a message has no parts list")
    text, calls = genai_parts(parts, limits)
    name = m.get("name")
    return OtelMessage(role, text, name if isinstance(name, str) else None, calls)


def genai_parts(parts: list[Any], limits: Limits) -> tuple[str, tuple[OtelToolCall, ...]]:
    texts: list[str] = []
    calls: list[OtelToolCall] = []
    for p in parts:
        if isinstance(p, str):
            texts.append(p)
            continue
        if not isinstance(p, dict):
            raise OtelRefused("malformed_messages", "a message part is not an object")
        kind = p.get("type")
        if kind == "text":
            content = p.get("content", p.get("text"))
            if not isinstance(content, str):
                raise OtelRefused("malformed_messages", "a text part has no text")
            texts.append(content)
        elif kind == "tool_call":
            name = p.get("name")
            if not isinstance(name, str) or not name:
                raise OtelRefused("malformed_messages", "a tool call has no name")
            call_id = p.get("id")
            arguments = p.get("arguments")
            calls.append(
                OtelToolCall(
                    name,
                    "" if arguments is None else canonical_json(arguments, max_depth=limits.max_json_depth),
                    call_id if isinstance(call_id, str) else None,
                )
            )
        elif kind == "tool_call_response":
            response = p.get("response", p.get("result"))
            texts.append("" if response is None else canonical_json(response, max_depth=limits.max_json_depth))
    return "\n".join(texts), tuple(calls)


# --- indexed dialects (GenAI before v1.37, OpenInference) ------------------------------------


def _indexed(attrs: Attributes, limits: Limits, pattern: re.Pattern[str], sides: tuple[str, str]) -> list[OtelMessage]:
    grouped: dict[str, dict[int, dict[str, str]]] = {sides[0]: {}, sides[1]: {}}
    for key, value in attrs.items():
        match = pattern.fullmatch(key)
        if match is None:
            continue
        side, index, field = match.group(1), int(match.group(2)), match.group(3)
        if index >= limits.max_messages:
            raise OtelRefused("too_many_messages", f"message index {index} over the limit {limits.max_messages}")
        if value.WhichOneof("value") != "string_value":
            if value.WhichOneof("value") == "int_value":
                text = str(value.int_value)
            else:
                continue
        else:
            text = value.string_value
        if len(text) > limits.max_attribute_bytes:
            raise OtelRefused("oversized_attribute", f"a message attribute is over {limits.max_attribute_bytes} bytes")
        grouped[side].setdefault(index, {})[field] = text
    history = [_indexed_message(grouped[sides[0]][i], limits) for i in sorted(grouped[sides[0]])]
    outputs = grouped[sides[1]]
    if outputs:
        history.append(_indexed_message(outputs[min(outputs)], limits))
    return history


def _indexed_message(fields: dict[str, str], limits: Limits) -> OtelMessage:
    role = role_of(fields.get("role"))
    content = fields.get("content")
    if content is None:
        pieces = sorted((int(m.group(1)), v) for k, v in fields.items() if (m := _CONTENTS_OI.fullmatch(k)) is not None)
        content = "\n".join(v for _, v in pieces)
    calls: dict[int, dict[str, str]] = {}
    for k, v in fields.items():
        m = _TOOL_CALL_OLD.fullmatch(k) or _TOOL_CALL_OI.fullmatch(k)
        if m is not None:
            calls.setdefault(int(m.group(1)), {})[m.group(2).removeprefix("function.")] = v
    tool_calls = []
    for i in sorted(calls):
        call = calls[i]
        if not call.get("name"):
            raise OtelRefused("malformed_messages", "a tool call has no name")
        tool_calls.append(
            OtelToolCall(
                call["name"], canonical_json(call.get("arguments", ""), max_depth=limits.max_json_depth), call.get("id")
            )
        )
    return OtelMessage(role, content, fields.get("name"), tuple(tool_calls))
