"""Spans in, contract-v1 events out: the part both doors share.

For each payload: find the chat spans (:mod:`sidecar.otel.dialects`), give each its conversation id
and agent (from the span, else from its nearest ancestor in the payload, else from any span of the
same trace in the payload), diff its history against what was seen (:mod:`sidecar.otel.history`),
and turn the new messages into the same records a native producer writes: key = conversation id,
value = a v1 event whose ``event_id`` is a function of (conversation, seq, message content). Every
record is checked with the sidecar's own decoder before it leaves, so what the doors produce is
never dead-lettered for its shape.
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

import msgspec
import structlog
from opentelemetry.proto.trace.v1.trace_pb2 import Span, TracesData

from sidecar.errors import DecodeError
from sidecar.events import MAX_ID_CHARS, decode_event
from sidecar.otel.config import OtelConfig
from sidecar.otel.dialects import Attributes, Limits, is_llm_span, read_history, string_attr
from sidecar.otel.errors import OtelRefused
from sidecar.otel.history import HistoryTracker
from sidecar.otel.messages import OtelMessage
from sidecar.otel.metrics import OtelMetrics

log = structlog.get_logger(__name__)

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

_AGENT_CHARS = re.compile(r"[^A-Za-z0-9_.:-]")
_ENCODER = msgspec.json.Encoder()


@dataclass(frozen=True, slots=True)
class ChatSpan:
    """One model call's history with the conversation it belongs to."""

    conversation_id: str
    agent: str | None
    history: list[OtelMessage]
    start_ns: int
    end_ns: int


@dataclass(slots=True)
class Derived:
    """What one payload yields: records to produce, and what was refused."""

    records: list[tuple[bytes, bytes]] = field(default_factory=list)
    conversations: set[str] = field(default_factory=set)
    refused: Counter[str] = field(default_factory=Counter)
    chat_spans: int = 0

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


def check_conversation_id(value: str) -> str:
    if not value or len(value) > MAX_ID_CHARS:
        raise OtelRefused("invalid_conversation_id", f"length {len(value)}; must be 1 to {MAX_ID_CHARS} characters")
    if not value.isprintable():
        raise OtelRefused("invalid_conversation_id", "contains control or separator characters")
    return value


class _Trace:
    """The spans of one trace in one payload: parent links and who carries ids."""

    __slots__ = ("agent", "conversation", "parents")

    def __init__(self) -> None:
        self.parents: dict[bytes, tuple[bytes, Attributes]] = {}
        self.conversation: str | None = None
        self.agent: str | None = None

    def add(self, span: Span, attrs: Attributes) -> None:
        self.parents[span.span_id] = (span.parent_span_id, attrs)
        if self.conversation is None:
            self.conversation = _first(attrs, CONVERSATION_KEYS)
        if self.agent is None:
            self.agent = _first(attrs, AGENT_KEYS)

    def lookup(self, span: Span, keys: tuple[str, ...], fallback: str | None) -> str | None:
        parent = span.parent_span_id
        for _ in range(MAX_ANCESTORS):
            entry = self.parents.get(parent)
            if entry is None:
                break
            parent, parent_attrs = entry
            found = _first(parent_attrs, keys)
            if found is not None:
                return found
        return fallback


def _first(attrs: Attributes, keys: tuple[str, ...]) -> str | None:
    for key in keys:
        value = string_attr(attrs, key)
        if value is not None:
            return value
    return None


class OtelIngest:
    """Normalise and diff; owned by one event loop (both doors share one instance and one tracker)."""

    def __init__(self, config: OtelConfig, metrics: OtelMetrics, *, max_event_bytes: int) -> None:
        lim = config.limits
        self._limits = Limits(lim.max_attribute_bytes, lim.max_json_depth, lim.max_messages_per_span)
        self._metrics = metrics
        self._max_event_bytes = max_event_bytes
        h = config.history
        self.tracker = HistoryTracker(h.max_conversations, h.max_state_bytes, h.idle_ttl_seconds)

    def refuse_payload(self, door: str, reason: str) -> None:
        self._metrics.refused.labels(door, reason).inc()

    def chat_spans(self, data: TracesData, refused: Counter[str]) -> tuple[list[ChatSpan], int]:
        """The payload's chat spans with their conversations, oldest first, and how many spans were
        not model calls; refusals are added to ``refused`` (nothing is counted in metrics here)."""
        traces: dict[bytes, _Trace] = {}
        candidates: list[tuple[Span, Attributes]] = []
        for rs in data.resource_spans:
            for ss in rs.scope_spans:
                for span in ss.spans:
                    span_attrs: Attributes = {kv.key: kv.value for kv in span.attributes}
                    traces.setdefault(span.trace_id, _Trace()).add(span, span_attrs)
                    candidates.append((span, span_attrs))
        out: list[ChatSpan] = []
        ignored = 0
        for span, attrs in candidates:
            try:
                chat = self._chat_span(span, attrs, traces[span.trace_id])
            except OtelRefused as exc:
                refused[exc.reason] += 1
                continue
            if chat is None:
                ignored += 1
            else:
                out.append(chat)
        out.sort(key=lambda c: (c.start_ns, c.end_ns))
        return out, ignored

    def _chat_span(self, span: Span, attrs: Attributes, trace: _Trace) -> ChatSpan | None:
        history = read_history(attrs, self._limits)
        if history is None:
            if is_llm_span(attrs):
                raise OtelRefused("content_missing", "a model call without message content (capture is off)")
            return None
        if not history:
            raise OtelRefused("content_missing", "a model call with an empty history")
        conversation = _first(attrs, CONVERSATION_KEYS) or trace.lookup(span, CONVERSATION_KEYS, trace.conversation)
        if conversation is None:
            raise OtelRefused("no_conversation_id", "none of " + ", ".join(CONVERSATION_KEYS))
        agent = _first(attrs, AGENT_KEYS) or trace.lookup(span, AGENT_KEYS, trace.agent)
        return ChatSpan(
            check_conversation_id(conversation),
            agent_label(agent),
            history,
            span.start_time_unix_nano,
            span.end_time_unix_nano or span.start_time_unix_nano,
        )

    def _count(self, door: str, normalised: int, ignored: int, refused: Counter[str]) -> None:
        m = self._metrics
        if normalised:
            m.spans.labels(door, "normalised").inc(normalised)
        if ignored:
            m.spans.labels(door, "ignored").inc(ignored)
        for reason, n in refused.items():
            m.spans.labels(door, "refused").inc(n)
            m.refused.labels(door, reason).inc(n)

    def derive(self, data: TracesData, door: str) -> Derived:
        """The records a payload yields (the tracker's state moves on at once: see :meth:`forget`)."""
        out = Derived()
        chats, ignored = self.chat_spans(data, out.refused)
        for chat in chats:
            try:
                out.records.extend(self._events(chat))
            except OtelRefused as exc:
                out.refused[exc.reason] += 1
                continue
            out.conversations.add(chat.conversation_id)
            out.chat_spans += 1
        self._count(door, out.chat_spans, ignored, out.refused)
        self._metrics.conversations.set(len(self.tracker))
        self._metrics.state_bytes.set(self.tracker.state_bytes)
        return out

    def forget(self, conversations: Iterable[str]) -> None:
        """Events for these conversations did not reach Kafka: re-derive them in full next time."""
        for cid in conversations:
            self.tracker.forget(cid)

    def _events(self, chat: ChatSpan) -> list[tuple[bytes, bytes]]:
        cid = chat.conversation_id
        digests = [m.digest() for m in chat.history]
        users = [i for i, m in enumerate(chat.history) if m.role == "user"]
        diff = self.tracker.diff(cid, digests, users)
        self._metrics.histories.labels(diff.kind).inc()
        if diff.kind == "rewritten":
            log.info("otel.history_rewritten", new_messages=len(diff.new))
        key = cid.encode("utf-8")
        ts = round(chat.end_ns / 1e9, 6)
        records = []
        for seq, i in diff.new:
            event: dict[str, object] = {
                "v": 1,
                "conversation_id": cid,
                "event_id": event_id(cid, seq, digests[i]),
                "seq": seq,
                "ts": ts,
                "type": "message",
                "message": chat.history[i].contract(),
            }
            if chat.agent is not None:
                event["agent"] = chat.agent
            value = _ENCODER.encode(event)
            try:
                decode_event(value, key, max_bytes=self._max_event_bytes)
            except DecodeError as exc:
                # Nothing of this span is produced; the next span re-derives the conversation in full.
                self.tracker.forget(cid)
                raise OtelRefused("contract_violation", f"{exc.reason}: {exc.detail}") from None
            records.append((key, value))
        return records
