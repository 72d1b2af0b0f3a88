"""People's feedback as span events: a ``sidecar.feedback`` event on any span becomes a v1
``feedback`` event (see ``docs/event-contract.md``, "Feedback").

The GenAI conventions have no settled name for human feedback yet, so the attributes are the
sidecar's own, one per field of the contract's ``feedback`` object:

=================================  =========================================================
``sidecar.feedback.target``        ``conversation``, ``turn`` or ``alert``
``sidecar.feedback.rating``        ``up`` / ``down``; on an alert ``true_alarm`` / ``false_alarm``
``sidecar.feedback.turn``          the 1-based turn (int), for a turn or an alert
``sidecar.feedback.alert_id``      the alert's id, for an alert
``sidecar.feedback.reason``        optional free text (never logged or exported)
``sidecar.feedback.id``            optional idempotency key; default: a hash of the span's ids, the
                                   event's time and its index on the span, so a re-sent span
                                   yields the same event (a ``duplicate_event`` to the sidecar)
=================================  =========================================================

The conversation and the agent are those of the span (found as for chat spans: the span, its
ancestors, its trace), unless the event itself carries ``gen_ai.conversation.id`` /
``gen_ai.agent.name``. Values are passed as they are; the door's check with the contract's decoder
refuses what does not fit (``contract_violation``), so hostile feedback never leaves the door.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from opentelemetry.proto.trace.v1.trace_pb2 import Span

from sidecar.otel.dialects import Attributes, string_attr

EVENT_NAME = "sidecar.feedback"
PREFIX = "sidecar.feedback."
_FIELDS = ("target", "rating", "alert_id", "reason")
#: Bounds that keep a hostile event cheap before the decoder's own (which are smaller).
MAX_VALUE_CHARS = 4096


@dataclass(frozen=True, slots=True)
class FeedbackEvent:
    """One ``sidecar.feedback`` span event, read but not yet checked against the contract."""

    body: dict[str, object]
    event_id: str
    conversation_id: str | None
    agent: str | None
    time_ns: int


def _bounded(value: str | None) -> str | None:
    return None if value is None else value[:MAX_VALUE_CHARS]


def _int_attr(attrs: Attributes, key: str) -> object:
    value = attrs.get(key)
    if value is None:
        return None
    kind = value.WhichOneof("value")
    if kind == "int_value":
        return value.int_value
    if kind == "string_value":
        return value.string_value[:MAX_VALUE_CHARS]  # the decoder refuses a turn given as text
    return None


def _default_id(span: Span, index: int, time_ns: int) -> str:
    h = hashlib.blake2b(digest_size=16)
    h.update(span.trace_id + span.span_id)
    h.update(b"\x00%d\x00%d" % (index, time_ns))
    return "otel-fb-" + h.hexdigest()


def read_feedback(span: Span) -> list[FeedbackEvent]:
    """The span's ``sidecar.feedback`` events, in order (none for most spans: one name check each)."""
    out: list[FeedbackEvent] = []
    for index, ev in enumerate(span.events):
        if ev.name != EVENT_NAME:
            continue
        attrs: Attributes = {kv.key: kv.value for kv in ev.attributes}
        body: dict[str, object] = {}
        for name in _FIELDS:
            value = _bounded(string_attr(attrs, PREFIX + name))
            if value is not None:
                body[name] = value
        turn = _int_attr(attrs, PREFIX + "turn")
        if turn is not None:
            body["turn"] = turn
        time_ns = ev.time_unix_nano or span.end_time_unix_nano or span.start_time_unix_nano
        given = _bounded(string_attr(attrs, PREFIX + "id"))
        out.append(
            FeedbackEvent(
                body=body,
                event_id=given if given else _default_id(span, index, time_ns),
                conversation_id=_bounded(string_attr(attrs, "gen_ai.conversation.id")),
                agent=_bounded(string_attr(attrs, "gen_ai.agent.name")),
                time_ns=time_ns,
            )
        )
    return out
