"""One open conversation, kept compact: about 1 KB of bookkeeping beyond its messages."""

from __future__ import annotations

from array import array

from sidecar.events import SpanRef
from sidecar.transcript.model import Message


class Conversation:
    """Messages in ``seq`` order plus the bookkeeping the turn state machine needs.

    ``first_offset`` is the Kafka offset of the conversation's first record: the partition can
    only commit below the smallest ``first_offset`` of its open conversations, so a restart can
    rebuild this conversation by re-reading from there. ``journal_start`` is the results-topic
    offset at which this conversation's journaled outcomes begin (see ``sidecar.source.processor``).
    ``opened_at_unix`` is the Kafka timestamp of that first record (wall clock, durable across
    restarts: the lifetime bound must not restart with the process). ``mem_bytes`` is the
    estimated memory its messages hold (:func:`sidecar.state.memory.message_bytes`). ``spans``
    holds, for conversations whose events carry OpenTelemetry ids, ``(message index, span)`` at
    every change of span (None until the first one: most conversations never pay for it).
    ``capped`` is the reason of the cap it reached, None while it has reached none.
    """

    __slots__ = (
        "agent",
        "capped",
        "closed_through",
        "conversation_id",
        "event_hashes",
        "first_offset",
        "journal_start",
        "last_activity",
        "mem_bytes",
        "messages",
        "opened_at_unix",
        "spans",
        "tenant",
        "turns",
    )

    def __init__(
        self,
        conversation_id: str,
        *,
        agent: str | None,
        tenant: str | None,
        first_offset: int,
        journal_start: int,
        now: float,
        opened_at_unix: float,
    ) -> None:
        self.conversation_id = conversation_id
        self.agent = agent
        self.tenant = tenant
        self.first_offset = first_offset
        self.journal_start = journal_start
        self.messages: list[Message] = []
        # hash() of each event_id, per seq: detects redelivered events without keeping the ids.
        self.event_hashes = array("q")
        self.turns = 0
        self.closed_through = 0
        self.mem_bytes = 0
        self.last_activity = now
        self.opened_at_unix = opened_at_unix
        self.spans: list[tuple[int, SpanRef]] | None = None
        # The dead-letter reason of the cap this conversation reached (too long or too large):
        # its state stops there, and every later message is refused for the same reason.
        self.capped: str | None = None

    def note_span(self, index: int, span: SpanRef | None) -> bool:
        """Remember that message ``index`` came from ``span``; True when that is a new entry."""
        if span is None:
            return False
        if self.spans is None:
            self.spans = []
        elif self.spans[-1][1] == span:
            return False
        self.spans.append((index, span))
        return True

    def span_before(self, message_count: int) -> SpanRef | None:
        """The span of the last message among the first ``message_count`` that carried one."""
        for index, span in reversed(self.spans or ()):
            if index < message_count:
                return span
        return None

    @property
    def next_seq(self) -> int:
        return len(self.messages)

    @property
    def awaiting_user(self) -> bool:
        """True when the agent has answered the open turn (its last message is a plain reply)."""
        if self.turns == 0 or self.closed_through >= self.turns or not self.messages:
            return False
        last = self.messages[-1]
        return last.role == "assistant" and not last.tool_calls
