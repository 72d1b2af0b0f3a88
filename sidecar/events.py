"""Event contract v1: decode one Kafka record into an :class:`Event` or a :class:`DecodeError`.

The JSON Schema of the contract is published in ``sidecar/schemas/event-v1.schema.json``; this
module is its executable form and a test checks the two agree. Decoding never raises anything but
:class:`~sidecar.errors.DecodeError`, whatever the bytes.
"""

from __future__ import annotations

import json
import math
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

MAX_FEEDBACK_REASON_CHARS = 1000
MAX_ARGUMENTS_DEPTH = 64
"""How deep a tool call's ``arguments`` object may nest. The JSON parser accepts about 1,000 levels,
but serialising that many recurses past Python's limit: a deeper object is refused (``schema``)."""
MAX_TS_CHARS = 64
MAX_TS_SECONDS = 253_402_300_800
"""Unix seconds must stay below this: 10000-01-01T00:00:00Z, where RFC 3339's four-digit year ends
(a millisecond timestamp taken for seconds lands far past it)."""
# RFC 3339 section 5.6 ``date-time``: T and Z in either case, a fraction of any length, leap
# second 60; ASCII digits only. The day is checked against its month after the match.
_RFC3339 = re.compile(
    r"([0-9]{4})-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])[Tt]([01][0-9]|2[0-3]):[0-5][0-9]:([0-5][0-9]|60)"
    r"(\.[0-9]+)?([Zz]|[+-]([01][0-9]|2[0-3]):[0-5][0-9])"
)
_DAYS_IN_MONTH = (31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)
NO_SEQ = -1
"""``Event.seq`` of feedback, which takes no place in the conversation's sequence."""

# Patterns end in \Z, not $: Python's $ also matches before a final newline ("booking\n").
AgentName = Annotated[str, Meta(pattern=r"^[A-Za-z0-9_.:-]{1,64}\Z")]
FeedbackTarget = Literal["conversation", "turn", "alert"]
FeedbackRating = Literal["up", "down", "true_alarm", "false_alarm"]
_RATINGS: dict[str, tuple[str, ...]] = {
    "conversation": ("up", "down"),
    "turn": ("up", "down"),
    "alert": ("true_alarm", "false_alarm"),
}

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


class _FeedbackIn(Struct, frozen=True, forbid_unknown_fields=True):
    target: FeedbackTarget
    rating: FeedbackRating
    turn: Annotated[int, Meta(ge=1, le=MAX_SEQ)] | None = None
    alert_id: Annotated[str, Meta(pattern=r"^[0-9a-f]{32}\Z")] | None = None
    reason: Annotated[str, Meta(max_length=MAX_FEEDBACK_REASON_CHARS)] | None = None


class _EventIn(Struct, frozen=True):
    conversation_id: Annotated[str, Meta(min_length=1, max_length=MAX_ID_CHARS)]
    event_id: Annotated[str, Meta(min_length=1, max_length=MAX_EVENT_ID_CHARS)]
    # Checked after parsing (:func:`_check_ts`), so every bad timestamp has one reason.
    ts: float | str
    type: Literal["message", "conversation_end", "feedback"]
    # Required for messages and ends (checked after parsing): feedback takes no place in the sequence.
    seq: Annotated[int, Meta(ge=0, le=MAX_SEQ)] | None = None
    v: Literal[1] = 1
    message: _MessageIn | None = None
    feedback: _FeedbackIn | None = None
    agent: AgentName | None = None
    tenant: Annotated[str, Meta(max_length=128)] | None = None
    trace_id: Annotated[str, Meta(pattern=r"^[0-9a-f]{32}\Z")] | None = None
    span_id: Annotated[str, Meta(pattern=r"^[0-9a-f]{16}\Z")] | None = None


_DECODER = msgspec.json.Decoder(_EventIn)


@dataclass(frozen=True, slots=True)
class SpanRef:
    """The OpenTelemetry span a message came from: lowercase hex ids, never all zeros.

    Optional in the contract (``trace_id`` and ``span_id``, both or neither): events derived from
    OpenTelemetry traces carry them, so results can be parented to the evaluated span.
    """

    trace_id: str
    span_id: str


@dataclass(frozen=True, slots=True)
class Feedback:
    """A person's judgement (``type: "feedback"``) on a whole conversation, one turn, or one alert.

    ``conversation`` and ``turn`` take ``up`` or ``down``; ``alert`` takes ``true_alarm`` or
    ``false_alarm`` and names the alert by its ``alert_id`` and ``turn`` (both in the alert's
    payload). ``reason`` is free text from a person: it never goes to logs, metrics or the results
    topic (only whether there was one).
    """

    target: FeedbackTarget
    rating: FeedbackRating
    turn: int | None = None
    alert_id: str | None = None
    reason: str | None = None


@dataclass(slots=True)
class Event:
    """A valid event. ``message`` is set iff ``type == "message"``, ``feedback`` iff
    ``type == "feedback"`` (whose ``seq`` is :data:`NO_SEQ`).

    Not frozen (one per record; a frozen ``__init__`` costs about 1 us more): treat it as read-only.
    """

    conversation_id: str
    event_id: str
    seq: int
    type: Literal["message", "conversation_end", "feedback"]
    message: Message | None
    agent: str | None
    tenant: str | None
    span: SpanRef | None = None
    feedback: Feedback | None = None


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
    [
        *_EventIn.__struct_fields__,
        *_MessageIn.__struct_fields__,
        *_ToolCallIn.__struct_fields__,
        *_FeedbackIn.__struct_fields__,
    ]
)
_JSON_TYPES = frozenset(["str", "int", "float", "bool", "null", "object", "array", "number"])
_LOCATION = re.compile(r"\$(?:\.([a-z_]+)|\[\d{1,6}\])*")


def _safe_quote(text: str) -> bool:
    if text in _CONTRACT_NAMES or all(part in _JSON_TYPES for part in text.split(" | ")):
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
    if message.endswith("- at `$.ts`"):
        return "invalid_timestamp"  # a boolean, null, array, object, or a number past a double
    if message.startswith("Expected `object`") and " - at `" not in message:
        return "not_an_object"
    return "schema"


def _nested_deeper_than(value: object, limit: int) -> bool:
    """Whether ``value`` nests more than ``limit`` containers deep (iterative: any depth is safe)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False


def _to_message(m: _MessageIn) -> Message:
    for i, call in enumerate(m.tool_calls):
        if not isinstance(call.arguments, str) and _nested_deeper_than(call.arguments, MAX_ARGUMENTS_DEPTH):
            raise DecodeError("schema", f"message.tool_calls[{i}].arguments: nested deeper than {MAX_ARGUMENTS_DEPTH}")
    calls = tuple(ToolCall(c.name, _canonical_arguments(c.arguments)) for c in m.tool_calls) if m.tool_calls else ()
    return Message(role=m.role, content=m.content, name=m.name, tool_calls=calls)


def decode_event(value: bytes | None, key: bytes | None, *, max_bytes: int) -> Event:
    """Decode and validate one record. Raises :class:`DecodeError` with a stable ``reason``.

    ``trace_id`` and ``span_id`` come together or not at all, and neither may be all zeros (the
    OpenTelemetry invalid id).

    ``seq`` is required except on feedback (where it is ignored); ``message`` comes with
    ``type: "message"`` only and ``feedback`` with ``type: "feedback"`` only (:class:`Feedback`
    says which targets take which ratings and fields).

    ``ts`` is an RFC 3339 date-time (at most 64 characters, a real calendar day) or non-negative
    Unix seconds before year 10000; anything else is ``invalid_timestamp``.

    Reasons: ``empty``, ``oversized``, ``invalid_utf8``, ``invalid_json``, ``not_an_object``,
    ``unsupported_version``, ``schema``, ``invalid_timestamp``, ``key_mismatch``.
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
    _check_ts(ev.ts)
    if ev.type != "feedback" and ev.seq is None:
        raise DecodeError("schema", "Object missing required field `seq`")
    if ev.type == "message" and ev.message is None:
        raise DecodeError("schema", "message: required when type is 'message'")
    if ev.type != "message" and ev.message is not None:
        raise DecodeError("schema", f"message: must be absent when type is '{ev.type}'")
    feedback = _feedback_of(ev)
    span = _span_of(ev)
    if key is None or key != ev.conversation_id.encode("utf-8"):
        raise DecodeError("key_mismatch", "record key must equal conversation_id")
    return Event(
        conversation_id=ev.conversation_id,
        event_id=ev.event_id,
        seq=NO_SEQ if ev.seq is None or feedback is not None else ev.seq,
        type=ev.type,
        message=_to_message(ev.message) if ev.message is not None else None,
        agent=ev.agent,
        tenant=ev.tenant,
        span=span,
        feedback=feedback,
    )


def _check_ts(ts: float | str) -> None:
    """Raise ``invalid_timestamp`` unless ``ts`` is what the contract documents. The detail never
    quotes a string ``ts`` (it is the producer's text)."""
    if isinstance(ts, str):
        match = _RFC3339.fullmatch(ts) if len(ts) <= MAX_TS_CHARS else None
        if match is None:
            raise DecodeError("invalid_timestamp", f"ts: not an RFC 3339 date-time of at most {MAX_TS_CHARS} chars")
        year, month, day = int(match[1]), int(match[2]), int(match[3])
        leap = year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)
        if day > _DAYS_IN_MONTH[month - 1] + (month == 2 and leap):
            raise DecodeError("invalid_timestamp", "ts: no such day in that month")
        return
    if not (math.isfinite(ts) and 0 <= ts < MAX_TS_SECONDS):
        raise DecodeError(
            "invalid_timestamp",
            f"ts: Unix seconds must be in [0, {MAX_TS_SECONDS}) (year 10000; milliseconds given as seconds?)",
        )


def _feedback_of(ev: _EventIn) -> Feedback | None:
    f = ev.feedback
    if ev.type != "feedback":
        if f is not None:
            raise DecodeError("schema", f"feedback: must be absent when type is '{ev.type}'")
        return None
    if f is None:
        raise DecodeError("schema", "feedback: required when type is 'feedback'")
    if f.rating not in _RATINGS[f.target]:
        raise DecodeError("schema", f"feedback.rating: {f.target} takes {' or '.join(_RATINGS[f.target])}")
    if f.target == "conversation" and (f.turn is not None or f.alert_id is not None):
        raise DecodeError("schema", "feedback: a conversation target takes neither turn nor alert_id")
    if f.target == "turn" and (f.turn is None or f.alert_id is not None):
        raise DecodeError("schema", "feedback: a turn target takes turn and no alert_id")
    if f.target == "alert" and (f.turn is None or f.alert_id is None):
        raise DecodeError("schema", "feedback: an alert target takes alert_id and turn")
    return Feedback(f.target, f.rating, f.turn, f.alert_id, f.reason)


def _span_of(ev: _EventIn) -> SpanRef | None:
    if ev.trace_id is None and ev.span_id is None:
        return None
    if ev.trace_id is None or ev.span_id is None:
        raise DecodeError("schema", "trace_id and span_id: both or neither")
    if not ev.trace_id.strip("0") or not ev.span_id.strip("0"):
        raise DecodeError("schema", "trace_id and span_id: all zeros is the invalid OpenTelemetry id")
    return SpanRef(ev.trace_id, ev.span_id)
