"""Event contract v1: decode one Kafka record into an :class:`Event` or a :class:`DecodeError`.

The JSON Schema of the contract is published in ``sidecar/schemas/event-v1.schema.json``; this
module is its executable form and a test checks the two agree. Decoding never raises anything but
:class:`~sidecar.errors.DecodeError`, whatever the bytes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError

from sidecar.errors import DecodeError
from sidecar.transcript.model import Message, ToolCall

CONTRACT_VERSION = 1
MAX_ID_CHARS = 256
MAX_EVENT_ID_CHARS = 128
MAX_SEQ = 1_000_000_000

AgentName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_.:-]{1,64}$")]


class _ToolCallIn(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True, strict=True)

    id: Annotated[str, StringConstraints(max_length=128)] | None = None
    name: Annotated[str, StringConstraints(min_length=1, max_length=128)]
    arguments: str | dict[str, Any] = ""


class _MessageIn(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    role: Literal["system", "user", "assistant", "tool"]
    content: str
    name: Annotated[str, StringConstraints(max_length=128)] | None = None
    tool_calls: Annotated[list[_ToolCallIn], Field(max_length=128)] = []


class _EventIn(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True, strict=True)

    v: Literal[1] = 1
    conversation_id: Annotated[str, StringConstraints(min_length=1, max_length=MAX_ID_CHARS)]
    event_id: Annotated[str, StringConstraints(min_length=1, max_length=MAX_EVENT_ID_CHARS)]
    seq: Annotated[int, Field(ge=0, le=MAX_SEQ)]
    ts: Annotated[float, Field(ge=0)] | Annotated[str, StringConstraints(min_length=1, max_length=64)]
    type: Literal["message", "conversation_end"]
    message: _MessageIn | None = None
    agent: AgentName | None = None
    tenant: Annotated[str, StringConstraints(max_length=128)] | None = None


@dataclass(frozen=True, slots=True)
class Event:
    """A valid event. ``message`` is set iff ``type == "message"``."""

    conversation_id: str
    event_id: str
    seq: int
    type: Literal["message", "conversation_end"]
    message: Message | None
    agent: str | None
    tenant: str | None
    text_bytes: int


def _canonical_arguments(arguments: str | dict[str, Any]) -> str:
    if isinstance(arguments, str):
        return arguments
    return json.dumps(arguments, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _has_surrogates(text: str) -> bool:
    # JSON may escape lone surrogates ("\ud800"); they are not valid Unicode and would break any
    # later UTF-8 encode (tokeniser, results topic), so they are rejected like invalid UTF-8.
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


MAX_DETAIL_CHARS = 400
_MAX_LOC_PART_CHARS = 32


def _loc_part(part: object) -> str:
    # A location part can be a field name from the record itself (an unknown key inside
    # ``message``): hostile input, bounded here and reduced to printable ASCII.
    text = "".join(c if c.isascii() and c.isprintable() else "?" for c in str(part)[: _MAX_LOC_PART_CHARS + 1])
    return text if len(text) <= _MAX_LOC_PART_CHARS else text[:_MAX_LOC_PART_CHARS] + "..."


def _schema_detail(exc: ValidationError) -> str:
    """Locations and error types only: never the offending input, which may be message text, and
    never more than ``MAX_DETAIL_CHARS`` (it goes to logs and dead-letter headers)."""
    parts = []
    for err in exc.errors(include_url=False, include_input=False)[:5]:
        loc = ".".join(_loc_part(p) for p in err["loc"][:6]) or "<root>"
        parts.append(f"{loc}: {err['type']}")
    detail = "; ".join(parts)
    return detail if len(detail) <= MAX_DETAIL_CHARS else detail[:MAX_DETAIL_CHARS] + "..."


def _to_message(m: _MessageIn, conversation_id: str, event_id: str) -> tuple[Message, int]:
    calls = tuple(ToolCall(c.name, _canonical_arguments(c.arguments)) for c in m.tool_calls)
    strings = [conversation_id, event_id, m.content, m.name or ""]
    strings += [s for c in calls for s in (c.name, c.arguments)]
    if any(_has_surrogates(s) for s in strings):
        raise DecodeError("invalid_utf8", "a string holds a lone surrogate escape")
    text_bytes = len(m.content.encode("utf-8")) + sum(len(c.arguments) + len(c.name) for c in calls)
    return Message(role=m.role, content=m.content, name=m.name, tool_calls=calls), text_bytes


_REASON_BY_ERROR_TYPE = {"json_invalid": "invalid_json", "recursion_loop": "invalid_json"}


def _reason_for(exc: ValidationError) -> str:
    errors = exc.errors(include_url=False, include_input=False)
    first = errors[0]
    if first["type"] in _REASON_BY_ERROR_TYPE:
        return _REASON_BY_ERROR_TYPE[first["type"]]
    if first["loc"] == () and first["type"] in ("model_type", "model_attributes_type", "dict_type"):
        return "not_an_object"
    if any(e["loc"] == ("v",) for e in errors):
        return "unsupported_version"
    return "schema"


def decode_event(value: bytes | None, key: bytes | None, *, max_bytes: int) -> Event:
    """Decode and validate one record. Raises :class:`DecodeError` with a stable ``reason``.

    Reasons: ``empty``, ``oversized``, ``invalid_utf8``, ``invalid_json``, ``not_an_object``,
    ``unsupported_version``, ``schema``, ``key_mismatch``.
    """
    if not value:
        raise DecodeError("empty", "record has no value")
    if len(value) > max_bytes:
        raise DecodeError("oversized", f"value is {len(value)} bytes; the limit is {max_bytes}")
    try:
        text = value.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DecodeError("invalid_utf8", f"byte {exc.start} is not valid UTF-8") from None
    try:
        # One pass in pydantic-core: parsing and validation together, no intermediate dicts.
        ev = _EventIn.model_validate_json(text)
    except ValidationError as exc:
        reason = _reason_for(exc)
        detail = "JSON syntax" if reason == "invalid_json" else _schema_detail(exc)
        raise DecodeError(reason, detail) from None
    if ev.type == "message" and ev.message is None:
        raise DecodeError("schema", "message: required when type is 'message'")
    if ev.type == "conversation_end" and ev.message is not None:
        raise DecodeError("schema", "message: must be absent when type is 'conversation_end'")
    if key is None or key != ev.conversation_id.encode("utf-8", "surrogatepass"):
        raise DecodeError("key_mismatch", "record key must equal conversation_id")
    if ev.message is not None:
        message, text_bytes = _to_message(ev.message, ev.conversation_id, ev.event_id)
    elif _has_surrogates(ev.conversation_id) or _has_surrogates(ev.event_id):
        raise DecodeError("invalid_utf8", "a string holds a lone surrogate escape")
    else:
        message, text_bytes = None, 0
    return Event(
        conversation_id=ev.conversation_id,
        event_id=ev.event_id,
        seq=ev.seq,
        type=ev.type,
        message=message,
        agent=ev.agent,
        tenant=ev.tenant,
        text_bytes=text_bytes,
    )
