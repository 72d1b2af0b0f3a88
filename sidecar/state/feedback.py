"""Which feedback a partition has applied, and whether a feedback's target exists.

Feedback (``type: "feedback"``, :class:`~sidecar.events.Feedback`) takes no place in its
conversation's sequence: it may arrive while the conversation is open or after it ended, and it
neither opens, extends nor ends one. It is accepted when its conversation is open on this partition
(and, for a turn or an alert, that turn has been reached) or remembered as finished
(:meth:`~sidecar.state.store.PartitionState.is_finished`).

Each ``event_id`` of a known conversation is taken once, whatever becomes of it: a second record
with the same id is a duplicate even when the first was refused for its turn or its alert. That
makes the memory a function of the source alone, so a restarted partition rebuilds it the way it
rebuilds the finished conversations: by scanning the source from the earliest-started finished
conversation it remembers (feedback on an older one is refused as unknown anyway) and replaying
from the committed offset. :class:`FeedbackMemory` is pure, like
:class:`~sidecar.state.store.PartitionState` (no I/O, no clock).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from sidecar.events import Event, Feedback
from sidecar.state.memory import FEEDBACK_ENTRY_BYTES
from sidecar.state.store import PartitionState, Rejected


@dataclass(frozen=True, slots=True)
class FeedbackTarget:
    """What a valid feedback is about: its conversation's labels, and whether it is still open."""

    feedback: Feedback
    agent: str | None
    tenant: str | None
    open: bool


class FeedbackMemory:
    """The feedback event ids one partition took (their hashes), at most ``capacity``, oldest
    forgotten first, their memory counted through ``hold``. Not a cache of the feedback itself:
    only what duplicate detection needs."""

    def __init__(self, capacity: int, hold: Callable[[int], None] | None = None) -> None:
        self._capacity = capacity
        self._seen: OrderedDict[int, None] = OrderedDict()
        # Where the memory is counted (PartitionState.hold: the partition's share of the budget).
        self._hold = hold or (lambda _n: None)

    def __len__(self) -> int:
        return len(self._seen)

    def take(self, state: PartitionState, event: Event) -> FeedbackTarget:
        """The target of ``event`` (a feedback event), its id taken; or :class:`Rejected` with the
        dead-letter reason: ``unknown_conversation`` (nothing taken), ``duplicate_event``,
        ``unknown_turn`` (the id taken all the same)."""
        fb = event.feedback
        assert fb is not None, "a feedback event"  # guaranteed by the decoder
        cid = event.conversation_id
        conv = state.conversations.get(cid)
        if conv is None and not state.is_finished(cid):
            raise Rejected("unknown_conversation", "feedback on a conversation this partition neither has nor recalls")
        h = hash(event.event_id)
        if h in self._seen:
            raise Rejected("duplicate_event", "feedback event_id was already taken")
        self._remember(h)
        if conv is None:
            return FeedbackTarget(fb, event.agent, event.tenant, open=False)
        if fb.turn is not None and fb.turn > conv.turns:
            raise Rejected("unknown_turn", f"feedback on turn {fb.turn}; the conversation has {conv.turns}")
        return FeedbackTarget(fb, event.agent or conv.agent, event.tenant or conv.tenant, open=True)

    def remember(self, event_id: str) -> None:
        """``event_id`` was taken before a restart (found by the recovery scan)."""
        self._remember(hash(event_id))

    def _remember(self, h: int) -> None:
        if not self._capacity or h in self._seen:
            return
        self._seen[h] = None
        self._hold(FEEDBACK_ENTRY_BYTES)
        while len(self._seen) > self._capacity:
            self._seen.popitem(last=False)
            self._hold(-FEEDBACK_ENTRY_BYTES)
