"""People's feedback on the way in: what the processor hands the feedback sink, and what it journals.

A feedback event (:class:`~sidecar.events.Feedback`) is checked by the state
(:class:`~sidecar.state.feedback.FeedbackMemory`: duplicate, unknown conversation or turn) and, on
an alert, by :meth:`FeedbackSink.resolve_alert` (the id must be the one this consumer group gives
that conversation's alert of some kind at that turn). Both checks are pure, so a replay after a
restart accepts and refuses exactly what the first pass did. Accepted feedback is then one effect:
:meth:`FeedbackSink.apply` counts it, and its outcome is journaled in the results topic
(``kind: "feedback"``) before the commit passes the record, so a replay applies it again never:
below the committed position it is replayed silently, and above it the journal names the record's
position. What must outlive the process (a judgement that moves thresholds:
:mod:`sidecar.alerting.ledger`) is written by :meth:`FeedbackSink.recorded`, whose future holds the
commit below the record too; it is asked again for a record re-read after a restart, and writes
only what is missing.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Protocol

from sidecar.contract import Outcome
from sidecar.state.feedback import FeedbackTarget


@dataclass(frozen=True, slots=True)
class FeedbackContext:
    """One accepted feedback: its conversation, event id, target and, for an alert, the alert's kind."""

    conversation_id: str
    event_id: str
    target: FeedbackTarget
    alert_kind: str | None
    received_at_unix: float


def feedback_outcome(ctx: FeedbackContext) -> dict[str, str | int | bool | None]:
    """The journaled outcome of a feedback: ids and closed-set values, never the reason's text."""
    fb = ctx.target.feedback
    return {
        "event_id": ctx.event_id,
        "target": fb.target,
        "rating": fb.rating,
        "turn": fb.turn,
        "alert_id": fb.alert_id,
        "alert_kind": ctx.alert_kind,
        "with_reason": bool(fb.reason),
        "conversation_open": ctx.target.open,
    }


class FeedbackSink(Protocol):
    """Where accepted feedback takes effect. Both methods are synchronous and must not raise for
    bad data (the event was validated before)."""

    def resolve_alert(self, conversation_id: str, turn: int, alert_id: str) -> str | None:
        """The kind of the alert ``alert_id`` names, None when it names none. Pure: a replay must
        get the same answer."""
        ...

    def apply(self, ctx: FeedbackContext) -> Outcome:
        """Count the feedback (and act on it); return the outcome the results topic records."""
        ...

    def recorded(self, ctx: FeedbackContext, *, again: bool) -> asyncio.Future[None] | None:
        """Write what of ``ctx`` must outlive the process; the future, done once it is durable,
        holds the commit below the record. ``again``: the record was applied before a restart
        (replayed or journaled); write only what is missing. None: nothing to write."""
        ...


def joined(acked: asyncio.Future[int], recorded: asyncio.Future[None] | None) -> asyncio.Future[int]:
    """``acked`` (the journal's acknowledgement, its position) once ``recorded`` is done too;
    cancelled when either is cancelled or fails, so the pin they hold stays."""
    if recorded is None:
        return acked
    both: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    def settle(_f: asyncio.Future[Any]) -> None:
        if both.done():
            return
        for f in (acked, recorded):
            if f.done() and (f.cancelled() or f.exception() is not None):
                both.cancel()
                return
        if acked.done() and recorded.done():
            both.set_result(acked.result())

    acked.add_done_callback(settle)
    recorded.add_done_callback(settle)
    return both


class UncountedFeedback:
    """The feedback sink of a stage built without one (tests, tools): knows no alert, counts nothing."""

    def resolve_alert(self, conversation_id: str, turn: int, alert_id: str) -> str | None:  # noqa: ARG002 - the protocol's signature
        return None

    def apply(self, ctx: FeedbackContext) -> Outcome:
        return feedback_outcome(ctx)

    def recorded(self, ctx: FeedbackContext, *, again: bool) -> asyncio.Future[None] | None:  # noqa: ARG002
        return None
