"""Partition-owned conversation state: ordering, idempotency, turns, TTL, debounce and caps.

The store is a pure state machine: :meth:`PartitionState.apply` takes a decoded event and returns
the hook triggers it causes, or raises :class:`Rejected` with a dead-letter reason; :meth:`due`
returns the triggers that time causes (idle debounce, idle TTL). It does no I/O, so the processor
can replay it deterministically after a restart and the property tests can drive it directly.

Invariants (tested with Hypothesis):

* a conversation's messages are exactly the events with seq 0..n-1, in order, each once;
* every trigger key ``(conversation, turn, kind)`` is produced at most once;
* the number of conversations and the bytes of text stay within the configured caps;
* ``conversation_ended`` is produced exactly once per conversation that was opened.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass

from sidecar.events import Event
from sidecar.state.config import StateConfig
from sidecar.state.conversation import Conversation
from sidecar.state.hooks import CloseReason, EndReason, HookKind


class Rejected(Exception):
    """The event is valid JSON but cannot be applied; ``reason`` is the dead-letter reason."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True, slots=True)
class Trigger:
    """A hook call the state machine asks for. ``conversation`` is the live object."""

    kind: HookKind
    conversation: Conversation
    turn: int
    message_count: int
    close_reason: CloseReason | None = None
    end_reason: EndReason | None = None

    @property
    def key(self) -> tuple[str, int, HookKind]:
        return trigger_key(self.conversation.conversation_id, self.turn, self.kind)


def trigger_key(conversation_id: str, turn: int, kind: HookKind) -> tuple[str, int, HookKind]:
    """Exactly-once key. A conversation ends once, so its ``conversation_ended`` key has turn 0."""
    return (conversation_id, 0 if kind == "conversation_ended" else turn, kind)


class PartitionState:
    """All open conversations of one partition."""

    def __init__(self, config: StateConfig) -> None:
        self._cfg = config
        # Insertion order is open order, hence first_offset order: the first entry bounds the
        # committable low-watermark.
        self.conversations: dict[str, Conversation] = {}
        # Least recently active first: drives idle TTL and eviction under the caps.
        self._lru: OrderedDict[str, None] = OrderedDict()
        # Conversations whose open turn waits for the debounce, oldest deadline first.
        self._debounce: OrderedDict[str, float] = OrderedDict()
        # Recently finished conversations (bounded, oldest forgotten first).
        self._finished: OrderedDict[str, None] = OrderedDict()
        self.text_bytes = 0
        self.evicted = 0

    # -- queries ---------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self.conversations)

    def oldest(self) -> Conversation | None:
        """The open conversation with the smallest first offset."""
        return next(iter(self.conversations.values()), None)

    # -- events ----------------------------------------------------------------------------

    def apply(self, event: Event, offset: int, now: float, journal_pos: int) -> list[Trigger]:
        """Apply one event; return the triggers it causes or raise :class:`Rejected`."""
        conv = self.conversations.get(event.conversation_id)
        if conv is None:
            if event.conversation_id in self._finished:
                raise Rejected("conversation_finished", "event for a conversation that already ended")
            if event.seq != 0:
                raise Rejected(
                    "seq_gap", f"unknown or finished conversation; expected seq 0, got {event.seq}"
                )
            if event.type == "conversation_end":
                raise Rejected("empty_conversation", "conversation_end for a conversation with no message")
            conv = Conversation(
                event.conversation_id,
                agent=event.agent,
                tenant=event.tenant,
                first_offset=offset,
                journal_start=journal_pos,
                now=now,
            )
            self.conversations[event.conversation_id] = conv
        else:
            self._check_order(conv, event)
        if event.type == "conversation_end":
            return self._finish(conv, "end_event")
        assert event.message is not None  # guaranteed by the decoder
        if len(conv.messages) >= self._cfg.max_messages_per_conversation:
            raise Rejected("conversation_too_long", f"over {self._cfg.max_messages_per_conversation} messages")
        triggers: list[Trigger] = []
        conv.messages.append(event.message)
        conv.event_hashes.append(hash(event.event_id))
        conv.text_bytes += event.text_bytes
        self.text_bytes += event.text_bytes
        conv.last_activity = now
        self._lru[conv.conversation_id] = None
        self._lru.move_to_end(conv.conversation_id)
        self._debounce.pop(conv.conversation_id, None)
        if event.message.role == "user":
            if conv.turns > conv.closed_through:
                triggers.append(self._close(conv, "next_user_message", len(conv.messages) - 1))
            conv.turns += 1
            triggers.append(Trigger("user_message", conv, conv.turns, len(conv.messages)))
        elif conv.awaiting_user:
            self._debounce[conv.conversation_id] = now + self._cfg.turn_debounce_seconds
        triggers.extend(self._enforce_caps(protect=conv.conversation_id))
        return triggers

    def _check_order(self, conv: Conversation, event: Event) -> None:
        expected = conv.next_seq
        h = hash(event.event_id)
        if event.seq < expected:
            if conv.event_hashes[event.seq] == h:
                raise Rejected("duplicate_event", f"event for seq {event.seq} was already applied")
            raise Rejected("duplicate_seq", f"seq {event.seq} already taken by another event")
        if h in conv.event_hashes:
            raise Rejected("duplicate_event", "event_id was already applied at another seq")
        if event.seq > expected:
            raise Rejected("seq_gap", f"expected seq {expected}, got {event.seq}")

    # -- time ------------------------------------------------------------------------------

    def due(self, now: float) -> list[Trigger]:
        """Triggers caused by the passage of time: debounced turn closes, then idle expiry."""
        out: list[Trigger] = []
        while self._debounce:
            cid, deadline = next(iter(self._debounce.items()))
            if deadline > now:
                break
            del self._debounce[cid]
            conv = self.conversations.get(cid)
            if conv is not None and conv.awaiting_user:
                out.append(self._close(conv, "idle_debounce", len(conv.messages)))
        cutoff = now - self._cfg.idle_ttl_seconds
        while self._lru:
            cid = next(iter(self._lru))
            conv = self.conversations[cid]
            if conv.last_activity > cutoff:
                break
            out.extend(self._finish(conv, "idle_ttl"))
        return out

    # -- transitions replayed from the journal ---------------------------------------------

    def replay_close(self, conversation_id: str, turn: int) -> None:
        """Apply a turn close recorded before a restart (its hook already ran)."""
        conv = self.conversations.get(conversation_id)
        if conv is not None and turn > conv.closed_through:
            conv.closed_through = min(turn, conv.turns)
            self._debounce.pop(conversation_id, None)

    def replay_end(self, conversation_id: str) -> None:
        """Apply a conversation end recorded before a restart (its hooks already ran)."""
        conv = self.conversations.get(conversation_id)
        if conv is not None:
            self._finish(conv, "idle_ttl")

    # -- internals -------------------------------------------------------------------------

    def _close(self, conv: Conversation, reason: CloseReason, message_count: int) -> Trigger:
        conv.closed_through = conv.turns
        return Trigger("turn_closed", conv, conv.turns, message_count, close_reason=reason)

    def _finish(self, conv: Conversation, reason: EndReason) -> list[Trigger]:
        out: list[Trigger] = []
        if conv.turns > conv.closed_through:
            out.append(self._close(conv, "conversation_end", len(conv.messages)))
        out.append(Trigger("conversation_ended", conv, conv.turns, len(conv.messages), end_reason=reason))
        cid = conv.conversation_id
        del self.conversations[cid]
        self._lru.pop(cid, None)
        self._debounce.pop(cid, None)
        self.text_bytes -= conv.text_bytes
        if self._cfg.finished_memory:
            self._finished[cid] = None
            if len(self._finished) > self._cfg.finished_memory:
                self._finished.popitem(last=False)
        return out

    def _enforce_caps(self, protect: str) -> Iterator[Trigger]:
        cfg = self._cfg
        while (
            len(self.conversations) > cfg.max_conversations_per_partition
            or self.text_bytes > cfg.max_text_bytes_per_partition
        ) and self._lru:
            cid = next(iter(self._lru))
            if cid == protect and len(self._lru) == 1:
                break
            if cid == protect:
                self._lru.move_to_end(cid)
                continue
            self.evicted += 1
            yield from self._finish(self.conversations[cid], "evicted")
