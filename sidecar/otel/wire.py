"""Reading an OTLP ``TracesData`` protobuf in slices, so no single parse holds the interpreter long.

``TracesData`` and ``ExportTraceServiceRequest`` are ``repeated ResourceSpans resource_spans = 1``;
``ResourceSpans`` is ``Resource resource = 1; repeated ScopeSpans scope_spans = 2; ...`` and
``ScopeSpans`` is ``InstrumentationScope scope = 1; repeated Span spans = 2; ...``. The wire bytes
are walked down to the spans (lengths only, nothing decoded) and cut into messages of at most
``spans_per_slice`` spans, each repeating its resource's and scope's own fields: every span keeps
its resource and scope, in order. Parsing the slices one by one and merging them gives the same
spans as one parse of the whole (protobuf's merge of concatenated messages), with each parse short.
The walk also counts the spans, so a payload with too many is refused before anything is parsed.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Final, TypeVar, overload

from google.protobuf.message import DecodeError, Message
from opentelemetry.proto.trace.v1.trace_pb2 import TracesData

from sidecar.otel.errors import OtelRefused

M = TypeVar("M", bound=Message)

_LEN: Final = 2
_SKIP: Final = {0: -1, 1: 8, 5: 4}  # varint (read), fixed64, fixed32; groups (3, 4) are refused
_NESTED: Final = 2  # the repeated child: ResourceSpans.scope_spans and ScopeSpans.spans


def _bad(detail: str) -> OtelRefused:
    return OtelRefused("invalid_protobuf", detail)


def _varint(buf: bytes, pos: int, end: int) -> tuple[int, int]:
    value = shift = 0
    while pos < end and shift < 64:
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7
    raise _bad("truncated or overlong varint")


def _fields(buf: bytes, start: int, end: int) -> Iterator[tuple[int, int, int, int]]:
    """(field number, field start, value start, field end) for each field in ``buf[start:end]``;
    the value of a length-delimited field is ``buf[value start:field end]``."""
    pos = start
    while pos < end:
        key, value_at = _varint(buf, pos, end)
        number, wire = key >> 3, key & 7
        if number == 0:
            raise _bad("field number 0")
        if wire == _LEN:
            length, value_at = _varint(buf, value_at, end)
            field_end = value_at + length
        elif wire in _SKIP:
            field_end = _varint(buf, value_at, end)[1] if _SKIP[wire] < 0 else value_at + _SKIP[wire]
        else:
            raise _bad(f"wire type {wire}")
        if field_end > end:
            raise _bad("a field runs past its message")
        yield number, pos, value_at, field_end
        pos = field_end


def _split(buf: bytes, start: int, end: int) -> tuple[bytes, list[bytes]]:
    """A message's own fields (raw, in order) and its repeated child messages (raw, with their tags)."""
    own: list[bytes] = []
    children: list[bytes] = []
    for number, at, _value_at, field_end in _fields(buf, start, end):
        if number == _NESTED:
            if buf[at] & 7 != _LEN:
                raise _bad("a nested message field is not length-delimited")
            children.append(buf[at:field_end])
        else:
            own.append(buf[at:field_end])
    return b"".join(own), children


def _tag_len(number: int, body: bytes) -> bytes:
    length = len(body)
    out = bytearray([(number << 3) | _LEN])
    while length >= 0x80:
        out.append((length & 0x7F) | 0x80)
        length >>= 7
    out.append(length)
    return bytes(out) + body


def slices(payload: bytes, spans_per_slice: int) -> tuple[int, list[bytes]]:
    """The payload's span count and ``TracesData`` messages of at most ``spans_per_slice`` spans
    each; raises :class:`OtelRefused` (``invalid_protobuf``) for bytes that are not a protobuf message."""
    out: list[bytes] = []
    rest: list[bytes] = []  # top-level fields other than resource_spans, kept as they came
    count = 0
    for number, at, value_at, field_end in _fields(payload, 0, len(payload)):
        if number != 1:
            rest.append(payload[at:field_end])
            continue
        if payload[at] & 7 != _LEN:
            raise _bad("resource_spans is not length-delimited")
        resource, scopes = _split(payload, value_at, field_end)
        if not scopes:
            out.append(_tag_len(1, resource))
        for scope_field in scopes:
            _, scope_at = _varint(scope_field, 0, len(scope_field))
            scope_at = _varint(scope_field, scope_at, len(scope_field))[1]
            scope, spans = _split(scope_field, scope_at, len(scope_field))
            count += len(spans)
            for i in range(0, max(len(spans), 1), spans_per_slice):
                group = scope + b"".join(spans[i : i + spans_per_slice])
                out.append(_tag_len(1, resource + _tag_len(_NESTED, group)))
    if rest:
        out.append(b"".join(rest))
    return count, out


@overload
def parse_slices(parts: list[bytes]) -> TracesData: ...
@overload
def parse_slices(parts: list[bytes], into: M) -> M: ...
def parse_slices(parts: list[bytes], into: Message | None = None) -> Message:
    """Merge the slices into one message (each parse is short: the interpreter is free between them).

    ``into``: an empty ``TracesData``; an empty ``LogsData`` reads log records the same way (``LogsData`` ->
    ``ResourceLogs`` -> ``ScopeLogs`` -> ``LogRecord`` has the same field numbers)."""
    data = TracesData() if into is None else into
    try:
        for part in parts:
            # protobuf bounds nesting itself (100 levels of AnyValue): deeper input is a DecodeError.
            data.MergeFromString(part)
    except (DecodeError, RecursionError, ValueError):
        raise _bad("not a TracesData / ExportTraceServiceRequest message") from None
    return data
