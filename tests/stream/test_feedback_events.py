"""``type: "feedback"`` in contract v1: the decoder and the published JSON Schema accept the same
feedback and refuse the same hostile ones, with the reason ``schema``; feedback takes no seq."""

from __future__ import annotations

import json
from typing import Any

import pytest

from sidecar.errors import DecodeError
from sidecar.events import NO_SEQ, Feedback, decode_event
from tests.stream.test_events import LIMIT, VALIDATOR

ALERT = "0123456789abcdef0123456789abcdef"


def fb(feedback: Any = ..., **over: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "conversation_id": "conv-1",
        "event_id": "f-1",
        "ts": 1700000000,
        "type": "feedback",
        "agent": "booking",
        "feedback": {"target": "conversation", "rating": "down"} if feedback is ... else feedback,
    }
    base.update(over)
    return {k: v for k, v in base.items() if v is not ...}


VALID: list[tuple[dict[str, Any], Feedback]] = [
    (fb(), Feedback("conversation", "down")),
    (
        fb({"target": "conversation", "rating": "up", "reason": "solved it"}),
        Feedback("conversation", "up", None, None, "solved it"),
    ),
    (fb({"target": "turn", "rating": "down", "turn": 3}), Feedback("turn", "down", 3)),
    (
        fb({"target": "alert", "rating": "false_alarm", "turn": 2, "alert_id": ALERT}),
        Feedback("alert", "false_alarm", 2, ALERT),
    ),
    (
        fb({"target": "alert", "rating": "true_alarm", "turn": 1, "alert_id": ALERT, "reason": None}),
        Feedback("alert", "true_alarm", 1, ALERT),
    ),
    (fb(seq=12), Feedback("conversation", "down")),  # a seq on feedback is ignored
]


@pytest.mark.parametrize(("obj", "expected"), VALID)
def test_feedback_decodes_and_matches_the_schema(obj: dict[str, Any], expected: Feedback) -> None:
    VALIDATOR.validate(obj)
    e = decode_event(json.dumps(obj).encode(), b"conv-1", max_bytes=LIMIT)
    assert (e.type, e.feedback, e.seq, e.message) == ("feedback", expected, NO_SEQ, None)


INVALID = [
    fb(None),  # type feedback without a body
    {k: v for k, v in fb().items() if k != "feedback"},
    fb({"target": "conversation", "rating": "true_alarm"}),  # alarm ratings are for alerts
    fb({"target": "turn", "rating": "false_alarm", "turn": 2}),
    fb({"target": "alert", "rating": "down", "turn": 2, "alert_id": ALERT}),  # thumbs are not for alerts
    fb({"target": "conversation", "rating": "up", "turn": 2}),
    fb({"target": "conversation", "rating": "up", "alert_id": ALERT}),
    fb({"target": "turn", "rating": "up"}),  # which turn?
    fb({"target": "turn", "rating": "up", "turn": 0}),  # turns are 1-based
    fb({"target": "turn", "rating": "up", "turn": "3"}),
    fb({"target": "turn", "rating": "up", "turn": 2, "alert_id": ALERT}),
    fb({"target": "alert", "rating": "true_alarm", "alert_id": ALERT}),  # the alert's turn is needed too
    fb({"target": "alert", "rating": "true_alarm", "turn": 2}),
    fb({"target": "alert", "rating": "true_alarm", "turn": 2, "alert_id": ALERT.upper()}),
    fb({"target": "alert", "rating": "true_alarm", "turn": 2, "alert_id": "../../etc/passwd"}),
    fb({"target": "conversation", "rating": "up", "reason": "x" * 1001}),  # oversized reason
    fb({"target": "conversation", "rating": "up", "reason": 5}),
    fb({"target": "conversation", "rating": "up", "by": "jane@example.org"}),  # unknown field
    fb({"target": "everything", "rating": "up"}),
    fb({"target": "conversation", "rating": "meh"}),
    fb("down"),
    fb([{"target": "conversation", "rating": "down"}]),
    fb(message={"role": "user", "content": "x"}),  # feedback carries no message
    {**fb(), "type": "message", "seq": 0, "message": {"role": "user", "content": "x"}},  # a message no feedback
    {**fb(), "type": "conversation_end", "seq": 3},
    {**fb(...), "type": "message", "feedback": ..., "message": {"role": "user", "content": "x"}},  # seq is needed
]


@pytest.mark.parametrize("obj", INVALID)
def test_hostile_feedback_is_refused_by_decoder_and_schema(obj: dict[str, Any]) -> None:
    obj = {k: v for k, v in obj.items() if v is not ...}
    with pytest.raises(DecodeError) as info:
        decode_event(json.dumps(obj).encode(), b"conv-1", max_bytes=LIMIT)
    assert info.value.reason == "schema"
    assert not VALIDATOR.is_valid(obj)


def test_refusals_never_echo_what_a_person_wrote() -> None:
    secret = "call me on +44 7700 900123"
    for body in ({"target": "conversation", "rating": secret}, {"target": "turn", "rating": "up", secret: 1}):
        with pytest.raises(DecodeError) as info:
            decode_event(json.dumps(fb(body)).encode(), b"conv-1", max_bytes=LIMIT)
        assert "7700" not in info.value.detail and "feedback" in info.value.detail


def test_oversized_feedback_record() -> None:
    raw = json.dumps(fb({"target": "conversation", "rating": "up", "reason": "y" * 900})).encode()
    with pytest.raises(DecodeError) as info:
        decode_event(raw, b"conv-1", max_bytes=512)
    assert info.value.reason == "oversized"
