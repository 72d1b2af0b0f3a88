"""Messages carried as span events: the GenAI conventions' older forms and their variants.

Read when a span has none of the attribute dialects (:mod:`sidecar.otel.dialects`):

* ``gen_ai.client.inference.operation.details``: the v1.37+ JSON attributes
  (``gen_ai.input.messages``, ...) on an event instead of the span (AWS Strands' newer releases);
  read exactly as on a span.
* ``gen_ai.system.message``, ``gen_ai.user.message``, ``gen_ai.assistant.message``,
  ``gen_ai.tool.message`` and ``gen_ai.choice`` (conventions v1.27 to v1.36): one event per message,
  in the span's event order. The event's body is either one JSON object in ``gen_ai.event.content``
  (Azure AI Inference, Semantic Kernel) or spread over the event's attributes: ``content``,
  ``role``, ``tool_calls``, ``id``, and for a choice ``index`` and ``message`` (a JSON text or a
  structured value). Only the first choice (``index`` 0) is kept.
* ``gen_ai.content.prompt`` / ``gen_ai.content.completion`` (before v1.27): JSON lists of
  ``{role, content}`` messages in ``gen_ai.prompt`` / ``gen_ai.completion``.

Content may be a text, a list of parts (GenAI ``{type: text, content}``, OpenAI ``{type: text,
text}``) or a list of content blocks (Bedrock Converse ``{text}``, ``{toolUse}``, ``{toolResult}``;
Anthropic ``{type: tool_use}``), also as the JSON text of such a list (AWS Strands serialises its
blocks): a text that parses as a list of objects with a known block key is read as blocks.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Final

from opentelemetry.proto.trace.v1.trace_pb2 import Span

from sidecar.otel.dialects import GENAI_INPUT, GENAI_OUTPUT, Limits, any_value, genai_history
from sidecar.otel.errors import OtelRefused
from sidecar.otel.messages import OtelMessage, OtelToolCall, canonical_json, check_depth, role_of
from sidecar.transcript.model import Role

DETAILS: Final = "gen_ai.client.inference.operation.details"
CHOICE: Final = "gen_ai.choice"
MESSAGE_EVENTS: Final[dict[str, Role]] = {
    "gen_ai.system.message": "system",
    "gen_ai.user.message": "user",
    "gen_ai.assistant.message": "assistant",
    "gen_ai.tool.message": "tool",
    CHOICE: "assistant",
}
OLD_PROMPT: Final = "gen_ai.content.prompt"
OLD_COMPLETION: Final = "gen_ai.content.completion"
_BLOCK_KEYS: Final = frozenset({"text", "type", "toolUse", "toolResult", "json"})
_READ: Final = frozenset({DETAILS, OLD_PROMPT, OLD_COMPLETION, *MESSAGE_EVENTS})


def read_event_history(span: Span, limits: Limits) -> list[OtelMessage] | None:
    """The history the span's events carry, or ``None`` when they carry none.

    Raises :class:`OtelRefused` for malformed, oversized or too deeply nested content."""
    # Exact names: OpenLLMetry adds a gen_ai.content.completion.chunk event per streamed chunk.
    events = [e for e in span.events if e.name in _READ]
    if not events:
        return None
    if len(events) > limits.max_messages + 1:
        raise OtelRefused("too_many_messages", f"{len(events)} message events; the limit is {limits.max_messages}")
    for e in events:
        if e.name == DETAILS:
            attrs = {kv.key: kv.value for kv in e.attributes}
            if GENAI_INPUT in attrs or GENAI_OUTPUT in attrs:
                return genai_history(attrs, limits)
    history: list[OtelMessage] = []
    choices = 0
    for e in sorted(events, key=lambda e: e.time_unix_nano):  # stable: equal times keep their order
        body = _body(e.attributes, limits)
        if e.name == OLD_PROMPT:
            history.extend(_message(m, None, limits) for m in _messages(body.get("gen_ai.prompt"), limits))
        elif e.name == OLD_COMPLETION:
            history.extend(
                _message(m, "assistant", limits) for m in _messages(body.get("gen_ai.completion"), limits)[:1]
            )
        elif e.name == CHOICE:
            if body.get("index", 0) not in (0, "0") or choices:
                continue  # n > 1 samples are alternatives, not turns
            choices += 1
            message = _json_text(body.get("message"), limits)
            message = message if isinstance(message, dict) else {"content": body.get("content", message)}
            history.append(_message(message, "assistant", limits))
        elif e.name in MESSAGE_EVENTS:
            history.append(_message(body, MESSAGE_EVENTS[e.name], limits))
    if len(history) > limits.max_messages:
        raise OtelRefused("too_many_messages", f"{len(history)} messages; the limit is {limits.max_messages}")
    return history or None


def _body(attributes: Sequence[Any], limits: Limits) -> dict[str, Any]:
    """An event's body: ``gen_ai.event.content`` when it is a JSON object, else its attributes."""
    out: dict[str, Any] = {}
    for kv in attributes:
        value = kv.value
        if value.WhichOneof("value") == "string_value":
            if len(value.string_value) > limits.max_attribute_bytes:
                raise OtelRefused(
                    "oversized_attribute", f"an event attribute is over {limits.max_attribute_bytes} bytes"
                )
            out[kv.key] = value.string_value
        else:
            if value.ByteSize() > limits.max_attribute_bytes:
                raise OtelRefused(
                    "oversized_attribute", f"an event attribute is over {limits.max_attribute_bytes} bytes"
                )
            out[kv.key] = any_value(value, limits.max_json_depth)
    content = _json_text(out.get("gen_ai.event.content"), limits)
    return content if isinstance(content, dict) else out


def _json_text(value: Any, limits: Limits) -> Any:
    """A JSON text parsed (depth-bounded); anything else, or text that is not JSON, as it is."""
    if not isinstance(value, str) or value[:1] not in ("{", "["):
        return value
    try:
        parsed = json.loads(value)
    except RecursionError:
        raise OtelRefused("too_deep", "an event attribute is nested too deeply") from None
    except ValueError:
        return value
    check_depth(parsed, limits.max_json_depth)
    return parsed


def _messages(value: Any, limits: Limits) -> list[Any]:
    parsed = _json_text(value, limits)
    if parsed is None:
        return []
    if not isinstance(parsed, list):
        raise OtelRefused("malformed_messages", "gen_ai.prompt / gen_ai.completion is not a list")
    return parsed


def _message(body: Any, default_role: Role | None, limits: Limits) -> OtelMessage:
    if not isinstance(body, dict):
        raise OtelRefused("malformed_messages", "a message event's body is not an object")
    raw_role = body.get("role")
    role = role_of(raw_role) if raw_role is not None or default_role is None else default_role
    text, calls = _content(body.get("content"), limits)
    listed = _json_text(body.get("tool_calls"), limits)
    if isinstance(listed, list):
        calls += tuple(_tool_call(c, limits) for c in listed)
    elif listed is not None:
        raise OtelRefused("malformed_messages", "tool_calls is not a list")
    name = body.get("name")
    return OtelMessage(role, text, name if isinstance(name, str) else None, calls)


def _content(value: Any, limits: Limits) -> tuple[str, tuple[OtelToolCall, ...]]:
    parsed = _json_text(value, limits) if isinstance(value, str) else value
    if isinstance(parsed, list) and parsed and all(isinstance(b, dict) and _BLOCK_KEYS & b.keys() for b in parsed):
        return _blocks(parsed, limits)
    if value is None:
        return "", ()
    if isinstance(value, str):
        return value, ()
    if isinstance(value, list) and all(isinstance(x, str) for x in value):
        return "\n".join(value), ()
    if isinstance(value, dict) and isinstance(value.get("text"), str):
        return value["text"], ()
    raise OtelRefused("malformed_messages", "message content is neither text nor a list of parts")


def _blocks(blocks: list[dict[str, Any]], limits: Limits) -> tuple[str, tuple[OtelToolCall, ...]]:
    texts: list[str] = []
    calls: list[OtelToolCall] = []
    for b in blocks:
        kind = b.get("type")
        if isinstance(b.get("toolUse"), dict):
            use = b["toolUse"]
            calls.append(_call(use.get("name"), use.get("input"), use.get("toolUseId"), limits))
        elif kind in ("tool_call", "tool_use"):
            calls.append(_call(b.get("name"), b.get("arguments", b.get("input")), b.get("id"), limits))
        elif isinstance(b.get("toolResult"), dict):
            texts.append(_content(b["toolResult"].get("content"), limits)[0])
        elif kind == "tool_call_response":
            response = b.get("response", b.get("result"))
            texts.append("" if response is None else canonical_json(response, max_depth=limits.max_json_depth))
        elif "json" in b and kind is None:
            texts.append(canonical_json(b["json"], max_depth=limits.max_json_depth))
        elif kind in (None, "text"):
            text = b.get("text", b.get("content"))
            if isinstance(text, str):
                texts.append(text)
        # other parts (images, documents, reasoning) are not transcript
    return "\n".join(texts), tuple(calls)


def _tool_call(call: Any, limits: Limits) -> OtelToolCall:
    if not isinstance(call, dict):
        raise OtelRefused("malformed_messages", "a tool call is not an object")
    function = call.get("function")
    source = function if isinstance(function, dict) else call
    return _call(source.get("name"), source.get("arguments"), call.get("id"), limits)


def _call(name: Any, arguments: Any, call_id: Any, limits: Limits) -> OtelToolCall:
    if not isinstance(name, str) or not name:
        raise OtelRefused("malformed_messages", "a tool call has no name")
    args = "" if arguments is None else canonical_json(arguments, max_depth=limits.max_json_depth)
    return OtelToolCall(name, args, call_id if isinstance(call_id, str) else None)
