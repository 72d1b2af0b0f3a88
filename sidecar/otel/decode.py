"""One reader for OTLP trace payloads: bytes (protobuf or OTLP JSON, optionally gzip) -> ``TracesData``.

OTLP/HTTP's ``ExportTraceServiceRequest`` and the Collector kafka exporter's ``otlp_proto`` records
are the same message on the wire (field 1, repeated ``ResourceSpans``), so one parser serves both
doors. OTLP JSON differs from protobuf's canonical JSON mapping in one way that matters: trace and
span ids are hex, not base64; they are rewritten before parsing. Nothing here raises anything but
:class:`~sidecar.otel.errors.OtelRefused`, whatever the bytes.
"""

from __future__ import annotations

import base64
import json
import zlib
from typing import Any, Literal

from google.protobuf import json_format
from google.protobuf.message import DecodeError as ProtobufDecodeError
from opentelemetry.proto.logs.v1.logs_pb2 import LogsData
from opentelemetry.proto.trace.v1.trace_pb2 import TracesData

from sidecar.otel.errors import OtelRefused
from sidecar.otel.wire import parse_slices, slices

Encoding = Literal["otlp_proto", "otlp_json"]

_GZIP_MAGIC = b"\x1f\x8b"

#: Spans parsed at a time from a protobuf payload (about a millisecond each slice).
SLICE_SPANS = 500

_ID_FIELDS = ("traceId", "spanId", "parentSpanId", "trace_id", "span_id", "parent_span_id")


def gunzip(body: bytes, *, max_bytes: int) -> bytes:
    """Decompress a gzip body, every member of it (RFC 1952: a gzip file is a series of members,
    as ``cat a.gz b.gz`` writes), refusing ``oversized`` as soon as the output passes ``max_bytes``
    in all, and ``invalid_gzip`` for a damaged or truncated member or bytes after the last one."""
    out = bytearray()
    rest = body
    while True:
        inflater = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
        try:
            out += inflater.decompress(rest, max_bytes + 1 - len(out))
        except zlib.error:
            raise OtelRefused("invalid_gzip", "not a valid gzip stream") from None
        if len(out) > max_bytes:
            raise OtelRefused("oversized", f"decompressed body is over {max_bytes} bytes")
        if not inflater.eof:
            raise OtelRefused("invalid_gzip", "truncated gzip stream")
        rest = inflater.unused_data
        if not rest:
            return bytes(out)
        if rest[:2] != _GZIP_MAGIC:
            raise OtelRefused("invalid_gzip", f"{len(rest)} bytes after the gzip stream")


def sniff(payload: bytes) -> Encoding:
    """OTLP JSON is an object; a ``TracesData`` protobuf starts with field 1's tag (0x0A) or is empty."""
    return "otlp_json" if payload.lstrip()[:1] == b"{" else "otlp_proto"


def decode_traces(payload: bytes, encoding: Encoding, *, max_bytes: int) -> TracesData:
    """Parse one payload; raises :class:`OtelRefused` (``empty``, ``oversized``, ``invalid_protobuf``,
    ``invalid_json``)."""
    if not payload:
        raise OtelRefused("empty", "no payload")
    if len(payload) > max_bytes:
        raise OtelRefused("oversized", f"payload is {len(payload)} bytes; the limit is {max_bytes}")
    if encoding == "otlp_proto":
        return _decode_proto(payload)
    return _decode_json(payload)


def decode_request(payload: bytes, encoding: Encoding, *, max_bytes: int, max_spans: int) -> TracesData:
    """:func:`decode_traces` for a request that may be large: a protobuf is counted (``too_many_spans``
    over ``max_spans``, before anything is parsed) and parsed :data:`SLICE_SPANS` spans at a time
    (:mod:`sidecar.otel.wire`); OTLP JSON is parsed whole and then counted."""
    if encoding == "otlp_json" or not payload or len(payload) > max_bytes:
        data = decode_traces(payload, encoding, max_bytes=max_bytes)
        _check_spans(sum(len(ss.spans) for rs in data.resource_spans for ss in rs.scope_spans), max_spans)
        return data
    count, parts = slices(payload, SLICE_SPANS)
    _check_spans(count, max_spans)
    return parse_slices(parts, TracesData())


def decode_logs_request(payload: bytes, encoding: Encoding, *, max_bytes: int, max_records: int) -> LogsData:
    """:func:`decode_request` for ``POST /v1/logs``: a ``LogsData`` / ``ExportLogsServiceRequest``,
    counted (``too_many_spans`` over ``max_records`` log records, before anything is parsed) and
    parsed in slices; the same refusals as for traces."""
    if not payload:
        raise OtelRefused("empty", "no payload")
    if len(payload) > max_bytes:
        raise OtelRefused("oversized", f"payload is {len(payload)} bytes; the limit is {max_bytes}")
    if encoding == "otlp_json":
        data = _decode_json_logs(payload)
        count = sum(len(sl.log_records) for rl in data.resource_logs for sl in rl.scope_logs)
    else:
        count, parts = slices(payload, SLICE_SPANS)
        if count <= max_records:
            data = parse_slices(parts, LogsData())
    if count > max_records:
        raise OtelRefused("too_many_spans", f"{count} log records; the limit is {max_records} per request")
    return data


def _decode_json_logs(payload: bytes) -> LogsData:
    raw = _json_object(payload)
    try:
        for rl in _objects(raw.get("resourceLogs", raw.get("resource_logs"))):
            for sl in _objects(rl.get("scopeLogs", rl.get("scope_logs"))):
                for record in _objects(sl.get("logRecords", sl.get("log_records"))):
                    _fix_ids(record)
        data = LogsData()
        json_format.ParseDict(raw, data, ignore_unknown_fields=True)
    except (json_format.ParseError, ValueError, TypeError, RecursionError, AttributeError):
        raise OtelRefused("invalid_json", "not OTLP JSON logs") from None
    return data


def _check_spans(count: int, max_spans: int) -> None:
    if count > max_spans:
        raise OtelRefused("too_many_spans", f"{count} spans; the limit is {max_spans} per request")


def _decode_proto(payload: bytes) -> TracesData:
    data = TracesData()
    try:
        # protobuf bounds nesting itself (100 levels of AnyValue): deeper input is a DecodeError.
        data.ParseFromString(payload)
    except (ProtobufDecodeError, RecursionError, ValueError):
        raise OtelRefused("invalid_protobuf", "not a TracesData / ExportTraceServiceRequest message") from None
    return data


def _decode_json(payload: bytes) -> TracesData:
    raw = _json_object(payload)
    try:
        _hex_ids_to_base64(raw)
        data = TracesData()
        json_format.ParseDict(raw, data, ignore_unknown_fields=True)
    except (json_format.ParseError, ValueError, TypeError, RecursionError, AttributeError):
        raise OtelRefused("invalid_json", "not OTLP JSON traces") from None
    return data


def _hex_ids_to_base64(raw: dict[str, Any]) -> None:
    for rs in _objects(raw.get("resourceSpans", raw.get("resource_spans"))):
        for ss in _objects(rs.get("scopeSpans", rs.get("scope_spans"))):
            for span in _objects(ss.get("spans")):
                _fix_ids(span)
                for link in _objects(span.get("links")):
                    _fix_ids(link)


def _objects(value: object) -> list[dict[str, Any]]:
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def _fix_ids(obj: dict[str, Any]) -> None:
    for name in _ID_FIELDS:
        value = obj.get(name)
        if isinstance(value, str) and value:
            try:
                obj[name] = base64.b64encode(bytes.fromhex(value)).decode("ascii")
            except ValueError:
                raise OtelRefused("invalid_json", f"{name} is not hex") from None


def _json_object(payload: bytes) -> dict[str, Any]:
    """The body as a JSON object; its syntax, or a top level that is not an object, is refused."""
    try:
        raw = json.loads(payload)
    except (ValueError, RecursionError):
        raise OtelRefused("invalid_json", "JSON syntax") from None
    if not isinstance(raw, dict):
        raise OtelRefused("invalid_json", "top level is not an object")
    return raw
