"""Slicing a TracesData protobuf on the wire: the same spans, resources and scopes as one parse."""

from __future__ import annotations

import random

import pytest
from google.protobuf.message import DecodeError
from opentelemetry.proto.trace.v1.trace_pb2 import TracesData

from sidecar.otel.decode import decode_request
from sidecar.otel.errors import OtelRefused
from sidecar.otel.wire import parse_slices, slices
from tests.otel.spans import chat_attrs, conversation, make_span, traces


def _sample() -> TracesData:
    data = traces([make_span(chat_attrs("genai", conversation(2), f"c-{i}")) for i in range(25)])
    second = data.resource_spans.add()
    second.resource.attributes.add(key="service.name").value.string_value = "other"
    second.schema_url = "https://example.test/schema"
    scope = second.scope_spans.add()
    scope.scope.name = "second"
    scope.spans.extend(make_span({"k": i}) for i in range(7))
    second.scope_spans.add().scope.name = "no spans"
    data.resource_spans.add()  # no scopes at all
    return data


def _flat(data: TracesData) -> list[tuple[bytes, str, str, bytes]]:
    return [
        (rs.resource.SerializeToString(), rs.schema_url, ss.scope.name, span.SerializeToString())
        for rs in data.resource_spans
        for ss in rs.scope_spans
        for span in ss.spans
    ]


@pytest.mark.parametrize("per_slice", [1, 4, 500])
def test_slices_parse_to_the_same_spans_with_their_resource_and_scope(per_slice: int) -> None:
    data = _sample()
    count, parts = slices(data.SerializeToString(), per_slice)
    assert count == 32
    merged = parse_slices(parts)
    assert _flat(merged) == _flat(data)
    assert {ss.scope.name for rs in merged.resource_spans for ss in rs.scope_spans} >= {"no spans"}
    if per_slice == 1:
        assert len(parts) >= 32


def test_too_many_spans_is_refused_before_parsing() -> None:
    raw = _sample().SerializeToString()
    assert len(decode_request(raw, "otlp_proto", max_bytes=1 << 20, max_spans=32).resource_spans) > 0
    with pytest.raises(OtelRefused) as exc:
        decode_request(raw, "otlp_proto", max_bytes=1 << 20, max_spans=31)
    assert exc.value.reason == "too_many_spans"


def test_hostile_bytes_are_invalid_protobuf_or_what_one_parse_reads() -> None:
    """Random and mutated bytes: the slicer refuses with invalid_protobuf, or reads what protobuf reads."""
    rng = random.Random(38)
    good = _sample().SerializeToString()
    cases = [bytes(rng.randrange(256) for _ in range(rng.randrange(1, 64))) for _ in range(300)]
    for _ in range(300):
        mutated = bytearray(good)
        for _ in range(rng.randrange(1, 4)):
            mutated[rng.randrange(len(mutated))] = rng.randrange(256)
        cases.append(bytes(mutated[: rng.randrange(1, len(mutated) + 1)]))
    for case in cases:
        try:
            merged = parse_slices(slices(case, 3)[1])
        except OtelRefused as exc:
            assert exc.reason == "invalid_protobuf"
            continue
        whole = TracesData()
        try:
            whole.ParseFromString(case)
        except DecodeError:
            pytest.fail("the slicer read a payload protobuf refuses")
        assert _flat(merged) == _flat(whole)
