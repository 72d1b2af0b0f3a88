"""Event contract v1: decode one Kafka record into an :class:`Event` or a :class:`DecodeError`.

The JSON Schema of the contract is published in ``sidecar/schemas/event-v1.schema.json``; this
module is its executable form and a test checks the two agree. Decoding never raises anything but
:class:`~sidecar.errors.DecodeError`, whatever the bytes.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta, Struct

from sidecar.errors import DecodeError
from sidecar.transcript.model import Message, ToolCall

CONTRACT_VERSION = 1
MAX_ID_CHARS = 256
MAX_EVENT_ID_CHARS = 128
MAX_SEQ = 1_000_000_000
MAX_DETAIL_CHARS = 400

AgentName = Annotated[str, Meta(pattern=r"^[A-Za-z0-9_.:-]{1,64}$")]

# The contract as typed structs: msgspec parses and validates in one pass (about 1 us for a typical
# event, against 9 us for the previous pydantic path), strictly: no coercion (``"3"`` or ``true``
# is not an int, ``1.5`` is not a seq), unknown top-level fields ignored, unknown message fields
# rejected. Lone surrogate escapes (``"\ud800"``) are malformed JSON to it, so every string that
# comes out is encodable UTF-8.


class _ToolCallIn(Struct, frozen=True):
    name: Annotated[str, Meta(min_length=1, max_length=128)]
    id: Annotated[str, Meta(max_length=128)] | None = None
    arguments: str | dict[str, Any] = ""


class _MessageIn(Struct, frozen=True, forbid_unknown_fields=True):
    role: Literal["system", "user", "assistant", "tool"]
    content: str
    name: Annotated[str, Meta(max_length=128)] | None = None
    tool_calls: Annotated[tuple[_ToolCallIn, ...], Meta(max_length=128)] = ()


class _EventIn(Struct, frozen=True):
    conversation_id: Annotated[str, Meta(min_length=1, max_length=MAX_ID_CHARS)]
    event_id: Annotated[str, Meta(min_length=1, max_length=MAX_EVENT_ID_CHARS)]
    seq: Annotated[int, Meta(ge=0, le=MAX_SEQ)]
    ts: Annotated[float, Meta(ge=0)] | Annotated[str, Meta(min_length=1, max_length=64)]
    type: Literal["message", "conversation_end"]
    v: Literal[1] = 1
    message: _MessageIn | None = None
    agent: AgentName | None = None
    tenant: Annotated[str, Meta(max_length=128)] | None = None
    trace_id: Annotated[str, Meta(pattern=r"^[0-9a-f]{32}$")] | None = None
    span_id: Annotated[str, Meta(pattern=r"^[0-9a-f]{16}$")] | None = None


_DECODER = msgspec.json.Decoder(_EventIn)


@dataclass(frozen=True, slots=True)
class SpanRef:
    """The OpenTelemetry span a message came from: lowercase hex ids, never all zeros.

    Optional in the contract (``trace_id`` and ``span_id``, both or neither): events derived from
    OpenTelemetry traces carry them, so results can be parented to the evaluated span.
    """

    trace_id: str
    span_id: str


@dataclass(slots=True)
class Event:
    """A valid event. ``message`` is set iff ``type == "message"``.

    Not frozen (one per record; a frozen ``__init__`` costs about 1 us more): treat it as read-only.
    """

    conversation_id: str
    event_id: str
    seq: int
    type: Literal["message", "conversation_end"]
    message: Message | None
    agent: str | None
    tenant: str | None
    span: SpanRef | None = None


def _canonical_arguments(arguments: str | dict[str, Any]) -> str:
    if isinstance(arguments, str):
        return arguments
    return json.dumps(arguments, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


_QUOTED = re.compile(r"`([^`]*)(`|$)")
_ENUM_VALUE = re.compile(r"Invalid enum value .*?(?= - at `|$)", re.DOTALL)
# What a detail may quote: the contract's own field names, JSON types, and locations built from them
# (``$.message.tool_calls[3].name``). Anything else quoted came from the record (an unknown field's
# name): hostile input that can hold a secret or PII, so it is never echoed.
_CONTRACT_NAMES = frozenset(
    [*_EventIn.__struct_fields__, *_MessageIn.__struct_fields__, *_ToolCallIn.__struct_fields__]
)
_JSON_TYPES = frozenset(["str", "int", "float", "bool", "null", "object", "array", "number"])
_LOCATION = re.compile(r"\$(?:\.([a-z_]+)|\[\d{1,6}\])*")


def _safe_quote(text: str) -> bool:
    if text in _CONTRACT_NAMES or text in _JSON_TYPES:
        return True
    if not _LOCATION.fullmatch(text):
        return False
    return all(name in _CONTRACT_NAMES for name in re.findall(r"\.([a-z_]+)", text))


def _clean_detail(message: str) -> str:
    """An error message fit for logs and dead-letter headers: msgspec's description of what is wrong
    and where, with anything taken from the record itself (an unknown field's name, an invalid enum
    value) replaced, printable ASCII only, bounded length."""
    text = _ENUM_VALUE.sub("Invalid enum value", message[: MAX_DETAIL_CHARS * 4])
    text = _QUOTED.sub(lambda m: m.group(0) if _safe_quote(m.group(1)) else "`<not shown>`", text)
    text = "".join(c if c.isascii() and c.isprintable() else "?" for c in text)
    return text if len(text) <= MAX_DETAIL_CHARS else text[:MAX_DETAIL_CHARS] + "..."


def _reason_for(message: str) -> str:
    if message.endswith("- at `$.v`"):
        return "unsupported_version"
    if message.startswith("Expected `object`") and " - at `" not in message:
        return "not_an_object"
    return "schema"


def _to_message(m: _MessageIn) -> Message:
    calls = tuple(ToolCall(c.name, _canonical_arguments(c.arguments)) for c in m.tool_calls) if m.tool_calls else ()
    return Message(role=m.role, content=m.content, name=m.name, tool_calls=calls)


def decode_event(value: bytes | None, key: bytes | None, *, max_bytes: int) -> Event:
    """Decode and validate one record. Raises :class:`DecodeError` with a stable ``reason``.

    ``trace_id`` and ``span_id`` come together or not at all, and neither may be all zeros (the
    OpenTelemetry invalid id).

    Reasons: ``empty``, ``oversized``, ``invalid_utf8``, ``invalid_json``, ``not_an_object``,
    ``unsupported_version``, ``schema``, ``key_mismatch``.
    """
    if not value:
        raise DecodeError("empty", "record has no value")
    if len(value) > max_bytes:
        raise DecodeError("oversized", f"value is {len(value)} bytes; the limit is {max_bytes}")
    try:
        value.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DecodeError("invalid_utf8", f"byte {exc.start} is not valid UTF-8") from None
    try:
        ev = _DECODER.decode(value)
    except msgspec.ValidationError as exc:
        message = str(exc)
        raise DecodeError(_reason_for(message), _clean_detail(message)) from None
    except (msgspec.DecodeError, RecursionError):
        raise DecodeError("invalid_json", "JSON syntax") from None
    if ev.type == "message" and ev.message is None:
        raise DecodeError("schema", "message: required when type is 'message'")
    if ev.type == "conversation_end" and ev.message is not None:
        raise DecodeError("schema", "message: must be absent when type is 'conversation_end'")
    span = _span_of(ev)
    if key is None or key != ev.conversation_id.encode("utf-8"):
        raise DecodeError("key_mismatch", "record key must equal conversation_id")
    return Event(
        conversation_id=ev.conversation_id,
        event_id=ev.event_id,
        seq=ev.seq,
        type=ev.type,
        message=_to_message(ev.message) if ev.message is not None else None,
        agent=ev.agent,
        tenant=ev.tenant,
        span=span,
    )


def _span_of(ev: _EventIn) -> SpanRef | None:
    if ev.trace_id is None and ev.span_id is None:
        return None
    if ev.trace_id is None or ev.span_id is None:
        raise DecodeError("schema", "trace_id and span_id: both or neither")
    if not ev.trace_id.strip("0") or not ev.span_id.strip("0"):
        raise DecodeError("schema", "trace_id and span_id: all zeros is the invalid OpenTelemetry id")
    return SpanRef(ev.trace_id, ev.span_id)
