"""Partition-owned conversation state: ordering, idempotency, turns, TTL, debounce and caps.

The store is a pure state machine: :meth:`PartitionState.apply` takes a decoded event and returns
the hook triggers it causes, or raises :class:`Rejected` with a dead-letter reason; :meth:`due`
returns the triggers that time causes (idle debounce, idle TTL). It does no I/O, so the processor
can replay it deterministically after a restart and the property tests can drive it directly.

Invariants (tested with Hypothesis):

* a conversation's messages are exactly the events with seq 0..n-1, in order, each once;
* once a message is refused for a cap (``conversation_too_long``, ``conversation_too_large``),
  every later message of that conversation is refused for the same cap (not as ``seq_gap``), and
  its ``conversation_end`` still ends it;
* every trigger key ``(conversation, turn, kind)`` is produced at most once;
* the number of conversations stays within its cap, one conversation's memory within
  ``max_conversation_bytes``, and the partition's memory within its share of the process budget
  whenever that budget is exceeded (see :class:`~sidecar.state.memory.MemoryBudget`);
* ``conversation_ended`` is produced exactly once per conversation that was opened.

Finished conversations are remembered by *start* order: the memory holds every finished
conversation whose first record is at or after :meth:`PartitionState.finished_from` (at most
``finished_memory`` of them). Every conversation that started before the commit point's offset has
finished, so a restarted partition rebuilds exactly this memory by scanning the source from
``finished_from`` to the commit offset for conversation starts (:meth:`remember_finished`).
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from dataclasses import dataclass

from sidecar.contract import CloseReason, EndReason, HookKind
from sidecar.events import Event
from sidecar.state.config import StateConfig
from sidecar.state.conversation import Conversation
from sidecar.state.memory import (
    CONVERSATION_OVERHEAD_BYTES,
    FINISHED_ENTRY_OVERHEAD_BYTES,
    SPAN_ENTRY_BYTES,
    MemoryBudget,
    id_bytes,
    message_bytes,
)


class Rejected(Exception):
    """The event is valid JSON but cannot be applied; ``reason`` is the dead-letter reason."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


@dataclass(slots=True)
class Trigger:
    """A hook call the state machine asks for. ``conversation`` is the live object.

    Not frozen: one is made per hook call, and a frozen dataclass's ``__init__`` costs about 1 us
    more; nothing keeps or hashes a trigger."""

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

    def __init__(self, config: StateConfig, budget: MemoryBudget | None = None) -> None:
        self._cfg = config
        self._budget = budget if budget is not None else MemoryBudget(config.max_memory_bytes)
        self._budget.join()
        # Insertion order is open order, hence first_offset order: the first entry bounds the
        # committable low-watermark.
        self.conversations: dict[str, Conversation] = {}
        # Least recently active first: drives idle TTL and eviction under the caps.
        self._lru: OrderedDict[str, None] = OrderedDict()
        # Conversations whose open turn waits for the debounce, oldest deadline first.
        self._debounce: OrderedDict[str, float] = OrderedDict()
        # Finished conversations by start offset: id -> first offset, and a min-heap to forget the
        # earliest-started first.
        self._finished: dict[str, int] = {}
        self._finished_heap: list[tuple[int, str]] = []
        self.mem_bytes = 0
        self.evicted = 0

    def close(self) -> None:
        """Hand this partition's bytes back to the process budget (the partition was given up)."""
        self._budget.leave(self.mem_bytes)
        self.mem_bytes = 0

    def hold(self, n: int) -> None:
        """Count ``n`` bytes (negative: give back) held for this partition outside its conversations
        (the feedback ids, :mod:`sidecar.state.feedback`): in its share of the process budget, and
        handed back with the rest by :meth:`close`."""
        self._add_bytes(n)

    def _add_bytes(self, n: int) -> None:
        self.mem_bytes += n
        self._budget.add(n)

    # -- queries ---------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self.conversations)

    def oldest(self) -> Conversation | None:
        """The open conversation with the smallest first offset."""
        return next(iter(self.conversations.values()), None)

    def finished_from(self) -> int | None:
        """The first offset of the earliest-started conversation the finished memory holds."""
        return self._finished_heap[0][0] if self._finished_heap else None

    def is_finished(self, conversation_id: str) -> bool:
        return conversation_id in self._finished

    # -- events ----------------------------------------------------------------------------

    def apply(
        self, event: Event, offset: int, now: float, journal_pos: int, opened_at_unix: float = 0.0
    ) -> list[Trigger]:
        """Apply one event; return the triggers it causes or raise :class:`Rejected`.

        ``opened_at_unix`` is the record's Kafka timestamp: used as the conversation's start time
        when this event opens it (the lifetime bound).
        """
        cfg = self._cfg
        size = message_bytes(event.message) if event.message is not None else 0
        conv = self.conversations.get(event.conversation_id)
        if conv is None:
            if event.conversation_id in self._finished:
                raise Rejected("conversation_finished", "event for a conversation that already ended")
            if event.seq != 0:
                raise Rejected("seq_gap", f"unknown or finished conversation; expected seq 0, got {event.seq}")
            if event.type == "conversation_end":
                raise Rejected("empty_conversation", "conversation_end for a conversation with no message")
            if size > cfg.max_conversation_bytes:
                raise Rejected("conversation_too_large", f"message of {size} bytes over {cfg.max_conversation_bytes}")
            conv = Conversation(
                event.conversation_id,
                agent=event.agent,
                tenant=event.tenant,
                first_offset=offset,
                journal_start=journal_pos,
                now=now,
                opened_at_unix=opened_at_unix,
            )
            self.conversations[event.conversation_id] = conv
            self._add_bytes(CONVERSATION_OVERHEAD_BYTES + id_bytes(event.conversation_id))
        else:
            self._check_order(conv, event)
        if event.type == "conversation_end":
            return self._finish(conv, "end_event")
        assert event.message is not None  # guaranteed by the decoder
        if len(conv.messages) >= cfg.max_messages_per_conversation:
            conv.capped = "conversation_too_long"
            raise Rejected("conversation_too_long", f"over {cfg.max_messages_per_conversation} messages")
        if conv.mem_bytes + size > cfg.max_conversation_bytes:
            conv.capped = "conversation_too_large"
            raise Rejected("conversation_too_large", f"over {cfg.max_conversation_bytes} bytes of state")
        triggers: list[Trigger] = []
        conv.messages.append(event.message)
        conv.event_hashes.append(hash(event.event_id))
        conv.capped = None  # a smaller message filled the seq a too-large one left open
        size += SPAN_ENTRY_BYTES * conv.note_span(len(conv.messages) - 1, event.span)
        conv.mem_bytes += size
        self._add_bytes(size)
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
            self._debounce[conv.conversation_id] = now + cfg.turn_debounce_seconds
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
            if conv.capped is None:
                raise Rejected("seq_gap", f"expected seq {expected}, got {event.seq}")
            # Past a cap the state keeps its prefix and the following seqs can never be filled:
            # every later message is refused for the cap, not as a gap, and the end still ends it.
            if event.type != "conversation_end":
                raise Rejected(conv.capped, f"seq {event.seq}: the conversation reached its cap at seq {expected}")

    # -- time ------------------------------------------------------------------------------

    def due(self, now: float, wall_now: float | None = None) -> list[Trigger]:
        """Triggers caused by the passage of time: debounced turn closes, idle expiry, the lifetime
        bound (when ``wall_now`` is given), and eviction when the process budget is exceeded."""
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
        if wall_now is not None:
            # Open order is start order (up to producers' clock skew): the front is the one that
            # pins the commit point, so it is the one that must not outlive the bound.
            born_before = wall_now - self._cfg.max_conversation_lifetime_seconds
            while self.conversations:
                conv = next(iter(self.conversations.values()))
                if conv.opened_at_unix > born_before:
                    break
                out.extend(self._finish(conv, "max_lifetime"))
        out.extend(self._enforce_caps(protect=None))
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

    def remember_finished(self, conversation_id: str, first_offset: int) -> None:
        """Rebuild the finished memory after a restart: this conversation started at
        ``first_offset``, before the commit point, so it has finished."""
        if conversation_id not in self.conversations:
            self._forget_over_capacity(conversation_id, first_offset)

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
        self._add_bytes(-(conv.mem_bytes + CONVERSATION_OVERHEAD_BYTES + id_bytes(cid)))
        self._forget_over_capacity(cid, conv.first_offset)
        return out

    def _forget_over_capacity(self, cid: str, first_offset: int) -> None:
        """Remember ``cid`` as finished; past ``finished_memory`` forget the earliest-started."""
        if not self._cfg.finished_memory or cid in self._finished:
            return
        self._finished[cid] = first_offset
        heapq.heappush(self._finished_heap, (first_offset, cid))
        self._add_bytes(FINISHED_ENTRY_OVERHEAD_BYTES + id_bytes(cid))
        while len(self._finished) > self._cfg.finished_memory:
            _, old = heapq.heappop(self._finished_heap)
            if self._finished.pop(old, None) is not None:
                self._add_bytes(-(FINISHED_ENTRY_OVERHEAD_BYTES + id_bytes(old)))

    def _enforce_caps(self, protect: str | None) -> list[Trigger]:
        """Evict least recently active conversations while over a cap (a list: called per event)."""
        cfg = self._cfg
        budget = self._budget
        out: list[Trigger] = []
        while self._lru and (
            len(self.conversations) > cfg.max_conversations_per_partition
            or (budget.over and self.mem_bytes > budget.share_bytes)
        ):
            cid = next(iter(self._lru))
            if cid == protect:
                if len(self._lru) == 1:
                    break
                self._lru.move_to_end(cid)
                continue
            self.evicted += 1
            out.extend(self._finish(self.conversations[cid], "evicted"))
        return out
