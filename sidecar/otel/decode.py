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
from opentelemetry.proto.trace.v1.trace_pb2 import TracesData

from sidecar.otel.errors import OtelRefused

Encoding = Literal["otlp_proto", "otlp_json"]

_ID_FIELDS = ("traceId", "spanId", "parentSpanId", "trace_id", "span_id", "parent_span_id")


def gunzip(body: bytes, *, max_bytes: int) -> bytes:
    """Decompress a gzip body, refusing (``oversized``) as soon as the output passes ``max_bytes``."""
    inflater = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
    try:
        out = inflater.decompress(body, max_bytes + 1)
    except zlib.error:
        raise OtelRefused("invalid_gzip", "not a valid gzip stream") from None
    if len(out) > max_bytes:
        raise OtelRefused("oversized", f"decompressed body is over {max_bytes} bytes")
    if not inflater.eof:
        raise OtelRefused("invalid_gzip", "truncated gzip stream")
    return out


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


def _decode_proto(payload: bytes) -> TracesData:
    data = TracesData()
    try:
        # protobuf bounds nesting itself (100 levels of AnyValue): deeper input is a DecodeError.
        data.ParseFromString(payload)
    except (ProtobufDecodeError, RecursionError, ValueError):
        raise OtelRefused("invalid_protobuf", "not a TracesData / ExportTraceServiceRequest message") from None
    return data


def _decode_json(payload: bytes) -> TracesData:
    try:
        raw = json.loads(payload)
    except (ValueError, RecursionError):
        raise OtelRefused("invalid_json", "JSON syntax") from None
    if not isinstance(raw, dict):
        raise OtelRefused("invalid_json", "top level is not an object")
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
