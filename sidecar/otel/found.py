"""What the doors find in spans, before it becomes events: a model call's history with its
conversation (:class:`ChatSpan`), an end signal, people's feedback, what waits (for earlier calls,
a late parent or content sent as log records), and the ids and labels each carries.

:class:`Trace` resolves a span's conversation id and agent from the span itself, else its nearest
ancestor in the payload, else any span of the same trace; :func:`event_id` is the idempotency key
that makes a re-derived message the same event.
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from collections.abc import Hashable
from dataclasses import dataclass, field

from opentelemetry.proto.trace.v1.trace_pb2 import Span

from sidecar.events import MAX_ID_CHARS, SpanRef
from sidecar.otel.dialects import Attributes, string_attr
from sidecar.otel.errors import OtelRefused
from sidecar.otel.feedback import FeedbackEvent
from sidecar.otel.messages import OtelMessage

#: Where a conversation id is looked for, first match wins.
CONVERSATION_KEYS = (
    "gen_ai.conversation.id",
    "session.id",  # OpenInference
    "langfuse.session.id",
    "traceloop.association.properties.session_id",  # OpenLLMetry's association properties
)
AGENT_KEYS = ("gen_ai.agent.name", "agent.name")
# How far up the parent chain an id is looked for (a chat span is rarely more than a few levels
# below its invoke_agent span; the bound keeps a cyclic or hostile parent chain cheap).
MAX_ANCESTORS = 64

# Spans of one trace kept for its held spans' ancestor lookups (a bound against a hostile trace).
MAX_TRACE_SPANS = 10_000

_AGENT_CHARS = re.compile(r"[^A-Za-z0-9_.:-]")


@dataclass(frozen=True, slots=True)
class ChatSpan:
    """One model call's history with the conversation it belongs to."""

    conversation_id: str
    agent: str | None
    history: list[OtelMessage]
    start_ns: int
    end_ns: int
    span: SpanRef | None = None


@dataclass(frozen=True, slots=True)
class EndSpan:
    """A span that ends its conversation (``otel.conversation_end``)."""

    conversation_id: str
    agent: str | None
    end_ns: int
    span: SpanRef | None


@dataclass(frozen=True, slots=True)
class FeedbackSpan:
    """A ``sidecar.feedback`` span event with its conversation (:mod:`sidecar.otel.feedback`)."""

    conversation_id: str
    agent: str | None
    event: FeedbackEvent
    span: SpanRef | None


@dataclass(slots=True)
class HeldChat:
    """A chat span waiting for the model calls whose replies it reads (``otel.hold.earlier_calls_seconds``)."""

    chat: ChatSpan
    deadline: float
    door: str
    source: Hashable | None
    held: bool = False


@dataclass(slots=True)
class Orphan:
    """A chat span with content and no conversation id yet, waiting for its parent
    (``otel.hold.parent_seconds``)."""

    span: Span
    attrs: Attributes
    deadline: float
    door: str
    source: Hashable | None
    wait: str = "parent"  # or "logs": a model call without content, waiting for its log records


@dataclass(slots=True)
class HeldContent:
    """GenAI content read from log records, waiting for its span (``otel.hold.logs_seconds``)."""

    deadline: float
    events: list[Span.Event]
    door: str
    source: Hashable | None


@dataclass(slots=True)
class Found:
    """What a door's input holds: chat spans (oldest first), end signals, people's feedback, and the
    count of the rest."""

    chats: list[HeldChat] = field(default_factory=list)
    ends: list[EndSpan] = field(default_factory=list)
    feedback: list[FeedbackSpan] = field(default_factory=list)
    ignored: int = 0


@dataclass(slots=True)
class Derived:
    """What a door's input yields: records to produce, what was refused, what became of end signals."""

    records: list[tuple[bytes, bytes]] = field(default_factory=list)
    conversations: set[str] = field(default_factory=set)
    refused: Counter[str] = field(default_factory=Counter)
    chat_spans: int = 0
    end_spans: int = 0
    feedback_events: int = 0
    ends: Counter[str] = field(default_factory=Counter)  # sidecar_otel_conversation_ends_total outcomes

    @property
    def rejected_spans(self) -> int:
        return sum(self.refused.values())


def event_id(conversation_id: str, seq: int, digest: bytes) -> str:
    """The idempotency key of the message at ``seq``: the same span always yields the same ids."""
    h = hashlib.blake2b(digest_size=16)
    h.update(conversation_id.encode("utf-8", "surrogatepass"))
    h.update(b"\x00%d\x00" % seq)
    h.update(digest)
    return "otel-" + h.hexdigest()


def agent_label(name: str | None) -> str | None:
    """The contract's agent pattern (``[A-Za-z0-9_.:-]{1,64}``): other characters become ``_``."""
    if not name:
        return None
    return _AGENT_CHARS.sub("_", name[:64]) or None


def span_ref(span: Span) -> SpanRef | None:
    """The span's ids as the contract writes them; ``None`` when they are not valid OpenTelemetry ids
    (wrong length or all zeros: the events then carry none rather than being refused)."""
    if len(span.trace_id) != 16 or len(span.span_id) != 8:
        return None
    if not span.trace_id.strip(b"\x00") or not span.span_id.strip(b"\x00"):
        return None
    return SpanRef(span.trace_id.hex(), span.span_id.hex())


def check_conversation_id(value: str) -> str:
    if not value or len(value) > MAX_ID_CHARS:
        raise OtelRefused("invalid_conversation_id", f"length {len(value)}; must be 1 to {MAX_ID_CHARS} characters")
    if not value.isprintable():
        raise OtelRefused("invalid_conversation_id", "contains control or separator characters")
    return value


class Trace:
    """The spans of one trace in one payload: parent links and who carries ids."""

    __slots__ = ("agent", "conversation", "parents")

    def __init__(self) -> None:
        self.parents: dict[bytes, tuple[bytes, Attributes]] = {}
        self.conversation: str | None = None
        self.agent: str | None = None

    def add(self, span: Span, attrs: Attributes) -> None:
        if len(self.parents) < MAX_TRACE_SPANS:
            self.parents[span.span_id] = (span.parent_span_id, attrs)
        if self.conversation is None:
            self.conversation = first_attr(attrs, CONVERSATION_KEYS)
        if self.agent is None:
            self.agent = first_attr(attrs, AGENT_KEYS)

    def lookup(self, span: Span, keys: tuple[str, ...], fallback: str | None) -> str | None:
        parent = span.parent_span_id
        for _ in range(MAX_ANCESTORS):
            entry = self.parents.get(parent)
            if entry is None:
                break
            parent, parent_attrs = entry
            found = first_attr(parent_attrs, keys)
            if found is not None:
                return found
        return fallback


def first_attr(attrs: Attributes, keys: tuple[str, ...]) -> str | None:
    for key in keys:
        value = string_attr(attrs, key)
        if value is not None:
            return value
    return None
