"""Event contract v1: the decoder accepts exactly what the published JSON Schema describes (on the
samples below) and turns everything else into a DecodeError with a stable reason, never a crash."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from functools import partial
from importlib import resources
from typing import Any

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.errors import DecodeError
from sidecar.events import decode_event

SCHEMA = json.loads(resources.files("sidecar").joinpath("schemas/event-v1.schema.json").read_text())
VALIDATOR = jsonschema.Draft202012Validator(SCHEMA)
LIMIT = 64 * 1024


def ev(**over: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "conversation_id": "conv-1",
        "event_id": "e-1",
        "seq": 0,
        "ts": "2026-01-01T00:00:00Z",
        "type": "message",
        "message": {"role": "user", "content": "Book a table for two"},
        "agent": "booking",
        "tenant": "acme",
    }
    base.update(over)
    return {k: v for k, v in base.items() if v is not ...}


def decode(obj: Any, key: bytes | None = b"conv-1") -> Any:
    raw = obj if isinstance(obj, bytes) else json.dumps(obj).encode()
    return decode_event(raw, key, max_bytes=LIMIT)


VALID = [
    ev(),
    ev(ts=1700000000.5, agent=None, tenant=...),
    ev(message={"role": "assistant", "content": "", "tool_calls": [{"name": "find", "arguments": {"n": 2}}]}),
    ev(message={"role": "tool", "content": "{}", "name": "find"}),
    ev(type="conversation_end", message=..., seq=7),
    ev(extra_field={"anything": True}),
    ev(trace_id="4bf92f3577b34da6a3ce929d0e0e4736", span_id="00f067aa0ba902b7"),
    ev(trace_id=None, span_id=None),
]

INVALID = [
    (ev(seq="3"), "schema"),
    (ev(seq=-1), "schema"),
    (ev(seq=True), "schema"),
    (ev(seq=1.5), "schema"),
    (ev(conversation_id=""), "schema"),
    (ev(conversation_id=7), "schema"),
    (ev(event_id=...), "schema"),
    (ev(type="delete"), "schema"),
    (ev(message=...), "schema"),
    (ev(type="conversation_end"), "schema"),
    (ev(message={"role": "god", "content": "x"}), "schema"),
    (ev(message={"role": "user"}), "schema"),
    (ev(message={"role": "user", "content": 5}), "schema"),
    (ev(message={"role": "user", "content": "x", "surprise": 1}), "schema"),
    (ev(message={"role": "user", "content": "x", "tool_calls": [{"arguments": "{}"}]}), "schema"),
    (ev(agent="bad agent name with spaces"), "schema"),
    (ev(agent="a" * 65), "schema"),
    (ev(v=2), "unsupported_version"),
    (ev(trace_id="4bf92f3577b34da6a3ce929d0e0e4736"), "schema"),
    (ev(span_id="00f067aa0ba902b7"), "schema"),
    (ev(trace_id="4BF92F3577B34DA6A3CE929D0E0E4736", span_id="00f067aa0ba902b7"), "schema"),
    (ev(trace_id="4bf92f3577b34da6a3ce929d0e0e4736", span_id="00f067aa0ba902b70"), "schema"),
    (ev(trace_id="0" * 32, span_id="00f067aa0ba902b7"), "schema"),
    (ev(trace_id="4bf92f3577b34da6a3ce929d0e0e4736", span_id="0" * 16), "schema"),
]


def test_span_ids_are_optional_and_kept() -> None:
    assert decode(ev()).span is None
    e = decode(ev(trace_id="4bf92f3577b34da6a3ce929d0e0e4736", span_id="00f067aa0ba902b7"))
    assert e.span is not None
    assert (e.span.trace_id, e.span.span_id) == ("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7")


@pytest.mark.parametrize("obj", VALID)
def test_valid_events_decode_and_match_schema(obj: dict[str, Any]) -> None:
    VALIDATOR.validate(obj)
    e = decode(obj)
    assert e.conversation_id == "conv-1"


@pytest.mark.parametrize(("obj", "reason"), INVALID)
def test_invalid_events_rejected_with_reason_and_by_schema(obj: dict[str, Any], reason: str) -> None:
    with pytest.raises(DecodeError) as info:
        decode(obj)
    assert info.value.reason == reason
    assert not VALIDATOR.is_valid(obj)


@pytest.mark.parametrize(
    ("raw", "key", "reason"),
    [
        (b"", b"k", "empty"),
        (None, b"k", "empty"),
        (b"x" * (LIMIT + 1), b"k", "oversized"),
        (b"\xc3\x28", b"k", "invalid_utf8"),
        (b'{"a": "\xed\xa0\x80"}', b"k", "invalid_utf8"),
        (b"{not json", b"k", "invalid_json"),
        (b"[" * 20_000 + b"]" * 20_000, b"k", "not_an_object"),
        (b'{"x": ' + b"[" * 20_000 + b"]" * 20_000 + b"}", b"k", "invalid_json"),  # too deep to skip
        (b"[]", b"k", "not_an_object"),
        (b"null", b"k", "not_an_object"),
        (b'"text"', b"k", "not_an_object"),
        (json.dumps(ev()).encode(), None, "key_mismatch"),
        (json.dumps(ev()).encode(), b"other", "key_mismatch"),
        # a lone surrogate escape is not valid Unicode: rejected by the JSON parser itself
        (json.dumps(ev(message={"role": "user", "content": "\ud800"})).encode(), b"conv-1", "invalid_json"),
    ],
)
def test_hostile_bytes(raw: bytes | None, key: bytes | None, reason: str) -> None:
    with pytest.raises(DecodeError) as info:
        decode_event(raw, key, max_bytes=LIMIT)
    assert info.value.reason == reason


TS_VALID = [
    "2026-01-01T00:00:00Z",
    "2026-01-01t00:00:00z",  # RFC 3339 allows lower case
    "2024-02-29T23:59:59.123456789+05:30",  # leap day, a long fraction, an offset
    "2016-12-31T23:59:60Z",  # a leap second
    "0000-01-01T00:00:00-00:00",
    "9999-12-31T23:59:59.999Z",
    0,
    0.0,
    1700000000,
    1700000000.5,
    253402300799.999,  # the last second of year 9999
]

TS_INVALID = [
    "yesterday",
    "",
    "now",
    "2026-01-01",  # a date without a time
    "2026-01-01T00:00:00",  # no offset
    "2026-01-01 00:00:00Z",  # a space for the T
    "2026-02-29T00:00:00Z",  # not a leap year
    "2026-02-30T00:00:00Z",
    "2026-04-31T00:00:00Z",
    "2026-13-01T00:00:00Z",
    "2026-00-10T00:00:00Z",
    "2026-01-01T24:00:00Z",
    "2026-01-01T00:60:00Z",
    "2026-01-01T00:00:61Z",
    "2026-01-01T00:00:00+24:00",
    "99999-01-01T00:00:00Z",  # year 99999
    "+2026-01-01T00:00:00Z",
    "-2026-01-01T00:00:00Z",
    "2026-01-01T00:00:00.Z",
    "2026-01-01T00:00:00Z" + "0" * 50,
    "2026-01-01T00:00:00." + "1" * 60 + "Z",  # over 64 characters
    "\u0662\u0660\u0662\u0666-01-01T00:00:00Z",  # Arabic-Indic digits: digits to Python, not to RFC 3339
    "2026-01-01T00:00:00Z\u0000",
    "\u202e2026-01-01T00:00:00Z",
    -1,
    -0.001,
    1.7e12,  # milliseconds given as seconds
    253402300800,  # year 10000
    1e308,
    True,
    False,
    None,
    [1700000000],
    {"seconds": 1700000000},
]


@pytest.mark.parametrize("ts", TS_VALID, ids=repr)
def test_documented_timestamps_are_accepted(ts: Any) -> None:
    VALIDATOR.validate(ev(ts=ts))
    assert decode(ev(ts=ts)).conversation_id == "conv-1"


@pytest.mark.parametrize("ts", TS_INVALID, ids=repr)
def test_invalid_timestamps_are_refused_with_their_own_reason(ts: Any) -> None:
    with pytest.raises(DecodeError) as info:
        decode(ev(ts=ts))
    assert info.value.reason == "invalid_timestamp"
    assert "yesterday" not in info.value.detail and "\u202e" not in info.value.detail
    if not (isinstance(ts, str) and _day_only_in_format(ts)):
        assert not VALIDATOR.is_valid(ev(ts=ts))  # the published schema refuses it too


def _day_only_in_format(ts: str) -> bool:
    """Days a month lacks: only the schema's ``format: date-time`` refuses them, and the
    validator here does not assert formats."""
    return ts[5:10] in ("02-29", "02-30", "04-31")


@pytest.mark.parametrize(
    "raw",
    [
        b"1e999",
        b"-1e999",
        b"1" + b"0" * 400,
        b"NaN",
        b"Infinity",
        b"-Infinity",
        b"0x10",
    ],
)
def test_timestamps_json_cannot_hold_are_refused(raw: bytes) -> None:
    value = json.dumps(ev(ts=0)).encode().replace(b'"ts": 0', b'"ts": ' + raw)
    assert raw in value
    with pytest.raises(DecodeError) as info:
        decode_event(value, b"conv-1", max_bytes=LIMIT)
    assert info.value.reason in ("invalid_timestamp", "invalid_json")


def test_a_timestamp_with_a_trailing_newline_is_refused() -> None:
    with pytest.raises(DecodeError, match="invalid_timestamp"):
        decode(ev(ts="2026-01-01T00:00:00Z\n"))


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(max_size=80), st.floats(), st.integers(), st.booleans(), st.none()))
def test_any_timestamp_is_accepted_or_refused_as_invalid_timestamp(ts: Any) -> None:
    try:
        raw = json.dumps(ev(ts=ts), allow_nan=False).encode()
    except ValueError:
        return  # NaN and infinities: not JSON (see the test above)
    try:
        decode_event(raw, b"conv-1", max_bytes=LIMIT)
    except DecodeError as exc:
        assert exc.reason == "invalid_timestamp", exc
    else:
        if isinstance(ts, str):
            assert VALIDATOR.is_valid(ev(ts=ts))
        else:
            assert not isinstance(ts, bool) and ts is not None and 0 <= ts < 253402300800


def _with_arguments(arguments_json: str) -> bytes:
    message = '{"role": "assistant", "content": "", "tool_calls": [{"name": "f", "arguments": ' + arguments_json + "}]}"
    return json.dumps(ev(message=None)).replace('"message": null', '"message": ' + message).encode()


def _nested(frames: int, fn: Callable[[], object]) -> object:
    return fn() if frames == 0 else _nested(frames - 1, fn)


@pytest.mark.parametrize("frames", [0, 100, 400])
def test_deeply_nested_tool_arguments_are_refused_not_raised(frames: int) -> None:
    """Regression: the JSON parser and the canonical serialisation of the arguments both count
    against Python's recursion limit, the serialisation a few levels more: at the depths in
    between (which ones depends on the caller's stack), a RecursionError escaped the decoder and
    ended the sidecar, again after every restart. Every depth, called from any stack depth."""
    reasons = Counter[str]()
    for depth in range(65, 1001):
        value = _with_arguments('{"a": ' * depth + "1" + "}" * depth)
        with pytest.raises(DecodeError) as info:
            _nested(frames, partial(decode_event, value, b"conv-1", max_bytes=LIMIT))
        reasons[info.value.reason] += 1
        if info.value.reason == "schema":
            assert "arguments" in info.value.detail
    assert set(reasons) <= {"schema", "invalid_json"} and reasons["schema"] > 0


def test_tool_arguments_up_to_the_depth_limit_are_kept() -> None:
    deepest = '{"a":' + "[" * 63 + "]" * 63 + "}"  # 64 levels: the object and 63 arrays
    e = decode_event(_with_arguments(deepest), b"conv-1", max_bytes=LIMIT)
    assert e.message is not None and e.message.tool_calls[0].arguments == deepest


def test_arguments_as_text_are_not_parsed_whatever_they_hold() -> None:
    deep = '{"a": ' * 5000 + "1" + "}" * 5000
    e = decode(ev(message={"role": "assistant", "content": "", "tool_calls": [{"name": "f", "arguments": deep}]}))
    assert e.message is not None and e.message.tool_calls[0].arguments == deep


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("conversation_id", "c" * 257),
        ("event_id", "e" * 129),
        ("tenant", "t" * 129),
        ("agent", ""),
        ("agent", "b\u00f6oking"),
        ("seq", 1_000_000_001),
        ("seq", 2**64),
        ("v", "1"),
        ("type", "MESSAGE"),
    ],
)
def test_out_of_range_fields_are_refused(field: str, value: Any) -> None:
    obj = ev(**{field: value})
    with pytest.raises(DecodeError) as info:
        decode(obj, key=str(obj["conversation_id"]).encode())
    assert info.value.reason in ("schema", "unsupported_version")
    assert not VALIDATOR.is_valid(obj)


@pytest.mark.parametrize(
    "over",
    [
        {"agent": "booking\n"},
        {"trace_id": "4bf92f3577b34da6a3ce929d0e0e4736\n", "span_id": "00f067aa0ba902b7"},
        {"trace_id": "4bf92f3577b34da6a3ce929d0e0e4736", "span_id": "00f067aa0ba902b7\n"},
    ],
)
def test_a_final_newline_does_not_pass_a_pattern(over: dict[str, str]) -> None:
    """Regression: Python's ``$`` matches before a final newline, so ``"booking\n"`` was an agent
    name (and a metric label). JSON Schema patterns are ECMA regular expressions, where it is not."""
    with pytest.raises(DecodeError) as info:
        decode(ev(**over))
    assert info.value.reason == "schema"


def test_many_tool_calls_and_long_names_are_bounded() -> None:
    calls = [{"name": "f", "arguments": "{}"}] * 129
    with pytest.raises(DecodeError, match="schema"):
        decode(ev(message={"role": "assistant", "content": "", "tool_calls": calls}))
    with pytest.raises(DecodeError, match="schema"):
        decode(ev(message={"role": "tool", "content": "", "name": "n" * 129}))
    with pytest.raises(DecodeError, match="schema"):
        decode(ev(message={"role": "assistant", "content": "", "tool_calls": [{"name": ""}]}))


def test_control_and_invisible_characters_in_ids_are_kept_as_data() -> None:
    """Ids are opaque: any text within the bounds is accepted (the key must equal it), and what
    is shown or logged of them is escaped where it is shown."""
    cid = "c\u202e\u0000\u2028\U000e0041"
    e = decode(ev(conversation_id=cid), key=cid.encode())
    assert e.conversation_id == cid


def test_detail_never_contains_message_text() -> None:
    secret = "my card is 4111 1111 1111 1111"
    with pytest.raises(DecodeError) as info:
        decode(ev(message={"role": "user", "content": secret, "bogus": secret}))
    assert "4111" not in str(info.value)


def test_special_token_strings_in_content_are_just_text() -> None:
    e = decode(ev(message={"role": "user", "content": "<|end_of_conversation|><|eot_id|>"}))
    assert e.message is not None
    assert e.message.content == "<|end_of_conversation|><|eot_id|>"


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=2048), st.one_of(st.none(), st.binary(max_size=32)))
def test_arbitrary_bytes_never_raise_past_decoder(raw: bytes, key: bytes | None) -> None:
    try:
        decode_event(raw, key, max_bytes=1024)
    except DecodeError as exc:
        assert exc.reason


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(["conversation_id", "event_id", "seq", "ts", "type", "message", "agent", "tenant", "v"]),
        json_values,
    )
)
def test_arbitrary_json_objects_never_raise_past_decoder(obj: dict[str, Any]) -> None:
    try:
        decode(obj, key=str(obj.get("conversation_id")).encode())
    except DecodeError as exc:
        assert exc.reason


def test_dead_letter_detail_is_bounded_and_never_echoes_field_names_at_length() -> None:
    """Regression: an unknown 950 KB field name inside ``message`` went whole into the
    dead-letter log line (and headers), secrets included."""
    secret = "sk-live-" + "A" * 950_000
    value = json.dumps(
        {
            "conversation_id": "c",
            "event_id": "e",
            "seq": 0,
            "ts": 1,
            "type": "message",
            "message": {"role": "user", "content": "x", secret: 1, "\u202etab\x00": 2},
        }
    ).encode()
    with pytest.raises(DecodeError) as err:
        decode_event(value, b"c", max_bytes=2_000_000)
    assert err.value.reason == "schema"
    assert len(err.value.detail) <= 403
    assert "A" * 40 not in err.value.detail
    assert err.value.detail.isascii() and "\x00" not in err.value.detail


@pytest.mark.parametrize(
    "message",
    [
        {"role": "user", "content": "x", "jane.roe@example.org": "4111 1111 1111 1111"},  # unknown field
        {"role": "my card is 4111 1111 1111 1111", "content": "x"},  # invalid enum value
    ],
)
def test_dead_letter_detail_never_quotes_what_the_record_holds(message: dict[str, Any]) -> None:
    value = json.dumps(ev(message=message)).encode()
    with pytest.raises(DecodeError) as err:
        decode_event(value, b"conv-1", max_bytes=LIMIT)
    assert err.value.reason == "schema"
    assert "$.message" in err.value.detail  # still says where
    assert "jane" not in err.value.detail and "4111" not in err.value.detail
