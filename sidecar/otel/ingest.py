"""Spans in, contract-v1 events out: the part both doors share.

For each payload: find the chat spans (:mod:`sidecar.otel.dialects`) and the end signals
(:mod:`sidecar.otel.ends`), give each its conversation id and agent (from the span, else from its
nearest ancestor in the payload, else from any span of the same trace in the payload), diff each
history against what was seen (:mod:`sidecar.otel.history`), and turn the new messages into the same
records a native producer writes: key = conversation id, value = a v1 event whose ``event_id`` is a
function of (conversation, seq, message content). Every record is checked with the sidecar's own
decoder before it leaves, so what the doors produce is never dead-lettered for its shape.

**Spans on events.** A message's event carries the ``trace_id``/``span_id`` of the span it was first
derived from: for an assistant reply, normally the model call that produced it; for a user or tool
message, the first model call that read it. A history re-derived from a later span (a restart, a
forgotten conversation, a later turn read first) carries that later span's ids. The event id does
not depend on them, so such a copy is the same event to the sidecar's dedup, which keeps the first
copy it applied. An end event carries the ids of the span that ended the conversation.

**Order.** Chat spans are taken oldest first (start time) across everything :meth:`OtelIngest.derive`
is given, end signals after all of them: an end read in the same payload (or bridge poll) as the
conversation's last model call is placed after its messages.
"""

from __future__ import annotations

import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Hashable, Iterable, Sequence

import msgspec
import structlog
from opentelemetry.proto.logs.v1.logs_pb2 import LogsData
from opentelemetry.proto.trace.v1.trace_pb2 import Span, TracesData

from sidecar.errors import DecodeError
from sidecar.events import SpanRef, decode_event
from sidecar.otel.config import OtelConfig
from sidecar.otel.dialects import Attributes, Limits, is_llm_span, read_history
from sidecar.otel.ends import END_DIGEST, EndSignals
from sidecar.otel.errors import OtelRefused
from sidecar.otel.feedback import read_feedback
from sidecar.otel.found import (
    AGENT_KEYS,
    CONVERSATION_KEYS,
    ChatSpan,
    Derived,
    EndSpan,
    FeedbackSpan,
    Found,
    HeldChat,
    HeldContent,
    Orphan,
    Trace,
    agent_label,
    check_conversation_id,
    event_id,
    first_attr,
    span_ref,
)
from sidecar.otel.history import HistoryTracker
from sidecar.otel.logs import SpanKey, has_reference, read_logs
from sidecar.otel.metrics import OtelMetrics
from sidecar.otel.refusals import RefusalLog
from sidecar.otel.span_events import read_event_history

log = structlog.get_logger(__name__)

# The doors whose chat spans wait for the earlier model calls they read: the bridge, which reads a
# backlog over several partitions and polls. The receiver reads spans in the order the app exported
# them, and decides each request at once.
WAITS_FOR_EARLIER_CALLS = frozenset({"bridge"})
# Spans remembered as read, so content arriving later as log records is known as a copy.
DONE_SPANS = 100_000
_ENCODER = msgspec.json.Encoder()


class OtelIngest:
    """Normalise and diff; owned by one event loop (both doors share one instance and one tracker)."""

    def __init__(
        self,
        config: OtelConfig,
        metrics: OtelMetrics,
        *,
        max_event_bytes: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        lim = config.limits
        self._limits = Limits(lim.max_attribute_bytes, lim.max_json_depth, lim.max_messages_per_span)
        self._metrics = metrics
        self._max_event_bytes = max_event_bytes
        self._ends = EndSignals(config.conversation_end)
        h = config.history
        self.tracker = HistoryTracker(h.max_conversations, h.max_state_bytes, h.idle_ttl_seconds)
        self._hold = config.hold
        self._clock = clock
        self._refusal_log = RefusalLog()
        self._held: list[HeldChat] = []
        self._held_ends: list[tuple[str, EndSpan]] = []  # (door, end of a conversation with held spans)
        self._orphans: list[Orphan] = []
        self._orphan_traces: dict[bytes, Trace] = {}
        # GenAI content read from log records, waiting for its span: (deadline, events)
        self._content: dict[SpanKey, HeldContent] = {}
        # spans whose history was read, so their content arriving later as logs is a copy
        self._done: OrderedDict[SpanKey, None] = OrderedDict()
        # where the content joined to a still-held span came from: not committed past either
        self._joined: dict[SpanKey, Hashable] = {}
        self._logs_seen = False

    @property
    def holding(self) -> int:
        """Spans held now (every wait, both doors), content from log records waiting for its span included."""
        return len(self._held) + len(self._orphans) + len(self._content)

    def due(self, door: str, now: float | None = None) -> bool:
        """True when a span this door holds has reached its deadline (a derivation decides it)."""
        now = self._clock() if now is None else now
        held: list[HeldChat | Orphan | HeldContent] = [*self._held, *self._orphans, *self._content.values()]
        return any(h.door == door and h.deadline <= now for h in held)

    def held_sources(self, door: str) -> list[Hashable]:
        """Where this door's held spans, and the log records joined to them, came from (the bridge commits
        no offset past them)."""
        held: list[HeldChat | Orphan | HeldContent] = [*self._held, *self._orphans, *self._content.values()]
        out = [h.source for h in held if h.door == door and h.source is not None]
        if self._joined:
            spans = {(o.span.trace_id, o.span.span_id): o.door for o in self._orphans}
            for h in self._held:
                if h.chat.span is not None:
                    spans[(bytes.fromhex(h.chat.span.trace_id), bytes.fromhex(h.chat.span.span_id))] = h.door
            self._joined = {k: v for k, v in self._joined.items() if k in spans}  # decided: forgotten
            out.extend(v for k, v in self._joined.items() if spans[k] == door)
        return out

    def refuse_payload(self, door: str, reason: str) -> None:
        self._metrics.refused.labels(door, reason).inc()

    def chat_spans(
        self,
        data: TracesData,
        refused: Counter[str],
        found: Found | None = None,
        *,
        door: str = "",
        source: Hashable | None = None,
        now: float = 0.0,
    ) -> Found:
        """The payload's chat spans and end signals with their conversations, added to ``found``;
        refusals are added to ``refused`` (nothing is counted in metrics here). A chat span without a
        conversation id waits for its parent (``otel.hold.parent_seconds``) when holds are on."""
        found = found if found is not None else Found()
        traces: dict[bytes, Trace] = {}
        candidates: list[tuple[Span, Attributes]] = []
        for rs in data.resource_spans:
            for ss in rs.scope_spans:
                for span in ss.spans:
                    span_attrs: Attributes = {kv.key: kv.value for kv in span.attributes}
                    trace = traces.get(span.trace_id)
                    if trace is None:
                        # a trace with held spans keeps growing: a late parent is found there
                        trace = self._orphan_traces.get(span.trace_id) or Trace()
                        traces[span.trace_id] = trace
                    trace.add(span, span_attrs)
                    candidates.append((span, span_attrs))
        for span, attrs in candidates:
            trace = traces[span.trace_id]
            feedback = self._feedback(span, attrs, trace, refused) if span.events else []
            found.feedback.extend(feedback)
            self._attach_content(span)
            try:
                chat = self._chat_span(span, attrs, trace)
            except OtelRefused as exc:
                wait = self._wait_for(exc.reason, attrs)
                if wait is not None and self._room():
                    seconds = self._hold.parent_seconds if wait == "parent" else self._hold.logs_seconds
                    self._orphans.append(Orphan(span, attrs, now + seconds, door, source, wait))
                    self._orphan_traces[span.trace_id] = trace
                    self._metrics.holds.labels(wait, "held").inc()
                    continue
                if wait is not None:
                    self._metrics.holds.labels(wait, "full").inc()
                refused[self._refusal(exc.reason, attrs)] += 1
                continue
            try:
                end = self._end_span(span, attrs, trace) if self._ends.matches(span, attrs) else None
            except OtelRefused as exc:
                refused[exc.reason] += 1
                continue
            if chat is not None:
                self._read(span)
                found.chats.append(HeldChat(chat, now + self._hold.earlier_calls_seconds, door, source))
            if end is not None:
                found.ends.append(end)
            if chat is None and end is None and not feedback:
                found.ignored += 1
        found.chats.sort(key=lambda h: (h.chat.start_ns, h.chat.end_ns))
        return found

    def _room(self) -> bool:
        return self.holding < self._hold.max_spans

    def _wait_for(self, reason: str, attrs: Attributes) -> str | None:
        """What a refused span may wait for: its parent, or its content as log records."""
        if reason == "no_conversation_id" and self._hold.parent_seconds > 0:
            return "parent"
        if reason == "content_missing_capture_off" and self._hold.logs_seconds > 0 and not has_reference(attrs):
            return "logs"
        return None

    def _refusal(self, reason: str, attrs: Attributes) -> str:
        """The cause, told apart: content by reference, content on logs that did not come, capture off."""
        if reason != "content_missing_capture_off":
            return reason
        if has_reference(attrs):
            return "content_by_reference"
        return "content_on_logs_not_received" if self._logs_seen else reason

    def _attach_content(self, span: Span) -> None:
        """Content read from log records becomes the span's events, as in event mode on the span."""
        key = (span.trace_id, span.span_id)
        content = self._content.pop(key, None)
        if content is not None:
            span.events.extend(content.events)
            if content.source is not None:
                self._joined[key] = content.source

    def _read(self, span: Span) -> None:
        """The span's history was read: its content arriving later as log records is a copy."""
        self._done[(span.trace_id, span.span_id)] = None
        if len(self._done) > DONE_SPANS:
            self._done.popitem(last=False)

    def _store_logs(
        self,
        logs: Sequence[LogsData],
        refused: Counter[str],
        now: float,
        door: str,
        sources: Sequence[Hashable] | None,
    ) -> int:
        """Keep the payloads' content events until their spans are read; returns the records ignored."""
        ignored = 0
        for k, payload in enumerate(logs):
            found = read_logs(payload)
            refused.update(found.refused)
            ignored += found.ignored
            for key, events in found.events.items():
                self._logs_seen = True
                held = self._content.get(key)
                if held is None and key in self._done:
                    ignored += len(events)  # its span was read with content of its own (SPAN_AND_EVENT)
                    continue
                if held is None:
                    if len(self._content) >= self._hold.max_spans:
                        self._metrics.holds.labels("span", "full").inc()
                        refused["too_many_messages"] += 1
                        continue
                    source = None if sources is None else sources[k]
                    held = self._content[key] = HeldContent(now + self._hold.logs_seconds, [], door, source)
                if len(held.events) + len(events) > self._limits.max_messages + 2:
                    refused["too_many_messages"] += 1
                    continue
                held.events.extend(events)
        for key, content in list(self._content.items()):
            if content.deadline <= now:
                del self._content[key]
                self._metrics.holds.labels("span", "expired").inc()
        return ignored

    def _orphans_found(self, door: str, found: Found, refused: Counter[str], now: float) -> None:
        """Held spans of this door whose parent came (they join ``found``) or whose wait is over."""
        keep: list[Orphan] = []
        for o in self._orphans:
            if o.door != door:
                keep.append(o)
                continue
            trace = self._orphan_traces.get(o.span.trace_id) or Trace()
            self._attach_content(o.span)
            try:
                chat = self._chat_span(o.span, o.attrs, trace)
            except OtelRefused as exc:
                waits = exc.reason in ("no_conversation_id", "content_missing_capture_off")
                if waits and o.deadline > now:
                    keep.append(o)
                    continue
                if waits:
                    self._metrics.holds.labels(o.wait, "expired").inc()
                refused[self._refusal(exc.reason, o.attrs)] += 1
                continue
            self._metrics.holds.labels(o.wait, "released").inc()
            if chat is not None:
                self._read(o.span)
                found.chats.append(HeldChat(chat, now + self._hold.earlier_calls_seconds, door, o.source))
        self._orphans = keep
        waiting = {o.span.trace_id for o in keep}
        self._orphan_traces = {t: v for t, v in self._orphan_traces.items() if t in waiting}

    def _waits_for_earlier_calls(self, held: HeldChat, now: float, deciding: set[str]) -> bool:
        """True when the span reads replies of model calls not derived yet and may still wait for them
        (each reply's event then carries the span that produced it, whatever order spans come in)."""
        chat = held.chat
        if held.door not in WAITS_FOR_EARLIER_CALLS or self._hold.earlier_calls_seconds <= 0:
            return False
        if held.deadline <= now or chat.conversation_id in deciding:
            return False
        known = self.tracker.known(chat.conversation_id, [m.digest() for m in chat.history])
        if known is None:
            return False
        # the last message is the call's own output; an assistant message before it is an earlier call's
        return any(m.role == "assistant" for m in chat.history[known:-1])

    def _ids(self, span: Span, attrs: Attributes, trace: Trace) -> tuple[str, str | None]:
        conversation = first_attr(attrs, CONVERSATION_KEYS) or trace.lookup(span, CONVERSATION_KEYS, trace.conversation)
        if conversation is None:
            raise OtelRefused("no_conversation_id", "none of " + ", ".join(CONVERSATION_KEYS))
        agent = first_attr(attrs, AGENT_KEYS) or trace.lookup(span, AGENT_KEYS, trace.agent)
        return check_conversation_id(conversation), agent_label(agent)

    def _chat_span(self, span: Span, attrs: Attributes, trace: Trace) -> ChatSpan | None:
        history = read_history(attrs, self._limits)
        if history is None and span.events and is_llm_span(attrs):
            # the older per-message events; only on model calls (an agent span repeats its turn there)
            history = read_event_history(span, self._limits)
        if history is None:
            if is_llm_span(attrs):
                raise OtelRefused("content_missing_capture_off", "a model call without message content")
            return None
        if not history:
            raise OtelRefused("content_empty", "a model call with an empty history")
        conversation, agent = self._ids(span, attrs, trace)
        return ChatSpan(
            conversation,
            agent,
            history,
            span.start_time_unix_nano,
            span.end_time_unix_nano or span.start_time_unix_nano,
            span_ref(span),
        )

    def _feedback(self, span: Span, attrs: Attributes, trace: Trace, refused: Counter[str]) -> list[FeedbackSpan]:
        out = []
        for event in read_feedback(span):
            try:
                if event.conversation_id is not None:
                    cid, agent = check_conversation_id(event.conversation_id), agent_label(event.agent)
                else:
                    cid, agent = self._ids(span, attrs, trace)
                    agent = agent_label(event.agent) or agent
            except OtelRefused as exc:
                refused[exc.reason] += 1
                continue
            out.append(FeedbackSpan(cid, agent, event, span_ref(span)))
        return out

    def _end_span(self, span: Span, attrs: Attributes, trace: Trace) -> EndSpan:
        conversation, agent = self._ids(span, attrs, trace)
        return EndSpan(conversation, agent, span.end_time_unix_nano or span.start_time_unix_nano, span_ref(span))

    def _count(self, door: str, out: Derived, ignored: int) -> None:
        m = self._metrics
        if out.chat_spans:
            m.spans.labels(door, "normalised").inc(out.chat_spans)
        if out.end_spans:
            m.spans.labels(door, "end_signal").inc(out.end_spans)
        if out.feedback_events:
            m.spans.labels(door, "feedback").inc(out.feedback_events)
        if ignored:
            m.spans.labels(door, "ignored").inc(ignored)
        for reason, n in out.refused.items():
            m.spans.labels(door, "refused").inc(n)
            m.refused.labels(door, reason).inc(n)
            self._refusal_log.note(door, reason, n)
        for outcome, n in out.ends.items():
            m.ends.labels(door, outcome).inc(n)

    def derive(
        self,
        data: TracesData | Sequence[TracesData],
        door: str,
        *,
        sources: Sequence[Hashable] | None = None,
        logs: Sequence[LogsData] = (),
        log_sources: Sequence[Hashable] | None = None,
        now: float | None = None,
    ) -> Derived:
        """The records a payload (or several: a bridge poll) yields, chat spans oldest first across
        all of them and the spans this door held (see :class:`~sidecar.otel.config.OtelHoldConfig`),
        end signals after every chat span (the tracker's state moves on at once: see :meth:`forget`).
        ``sources`` names where each payload came from (:meth:`held_sources`); ``logs``: GenAI content
        as log records (:mod:`sidecar.otel.logs`), joined to its spans by trace and span id."""
        now = self._clock() if now is None else now
        out = Derived()
        found = Found()
        found.ignored += self._store_logs(logs, out.refused, now, door, log_sources)
        payloads = [data] if isinstance(data, TracesData) else list(data)
        for k, payload in enumerate(payloads):
            source = None if sources is None else sources[k]
            self.chat_spans(payload, out.refused, found, door=door, source=source, now=now)
        self._orphans_found(door, found, out.refused, now)
        mine = [h for h in self._held if h.door == door]
        self._held = [h for h in self._held if h.door != door]
        # a conversation one of whose held spans is due is decided in full now, oldest span first
        deciding = {h.chat.conversation_id for h in mine if h.deadline <= now}
        chats = sorted([*mine, *found.chats], key=lambda h: (h.chat.start_ns, h.chat.end_ns))
        for held in chats:
            chat = held.chat
            if self._waits_for_earlier_calls(held, now, deciding):
                if held.held or self._room():
                    if not held.held:
                        self._metrics.holds.labels("earlier_calls", "held").inc()
                        held.held = True
                    self._held.append(held)
                    continue
                self._metrics.holds.labels("earlier_calls", "full").inc()
            elif held.held:
                outcome = "expired" if held.deadline <= now or chat.conversation_id in deciding else "released"
                self._metrics.holds.labels("earlier_calls", outcome).inc()
            try:
                out.records.extend(self._events(chat, out))
            except OtelRefused as exc:
                out.refused[exc.reason] += 1
                continue
            out.conversations.add(chat.conversation_id)
            out.chat_spans += 1
        self._ends_found(door, found.ends, out)
        for fb in found.feedback:  # takes no seq: the history tracker is not involved
            try:
                out.records.append(self._feedback_event(fb))
            except OtelRefused as exc:
                out.refused[exc.reason] += 1
                continue
            out.feedback_events += 1
        self._count(door, out, found.ignored)
        self._metrics.conversations.set(len(self.tracker))
        self._metrics.state_bytes.set(self.tracker.state_bytes)
        return out

    def _ends_found(self, door: str, found: list[EndSpan], out: Derived) -> None:
        waiting = {h.chat.conversation_id for h in self._held}
        ends = [e for d, e in self._held_ends if d == door] + found
        self._held_ends = [(d, e) for d, e in self._held_ends if d != door]
        for end in ends:
            if end.conversation_id in waiting:  # placed after the held spans' messages
                self._held_ends.append((door, end))
                continue
            out.end_spans += 1
            record = self._end_event(end, out)
            if record is not None:
                out.records.append(record)
                out.conversations.add(end.conversation_id)

    def forget(self, conversations: Iterable[str]) -> None:
        """Events for these conversations did not reach Kafka: re-derive them in full next time."""
        for cid in conversations:
            self.tracker.forget(cid)

    def _events(self, chat: ChatSpan, out: Derived) -> list[tuple[bytes, bytes]]:
        cid = chat.conversation_id
        digests = [m.digest() for m in chat.history]
        users = [i for i, m in enumerate(chat.history) if m.role == "user"]
        diff = self.tracker.diff(cid, digests, users)
        self._metrics.histories.labels(diff.kind).inc()
        if diff.kind == "rewritten":
            log.info("otel.history_rewritten", new_messages=len(diff.new))
        if diff.after_end:
            # The end was read before this model call: the sidecar dead-letters these messages
            # (conversation_finished). Counted so an operator sees markers read out of order.
            out.ends["late_messages"] += 1
        records = []
        for seq, i in diff.new:
            event = self._event(cid, seq, digests[i], end_ns=chat.end_ns, agent=chat.agent, span=chat.span)
            event["type"] = "message"
            event["message"] = chat.history[i].contract()
            records.append(self._checked(cid, event))
        return records

    def _end_event(self, end: EndSpan, out: Derived) -> tuple[bytes, bytes] | None:
        cid = end.conversation_id
        placed = self.tracker.end(cid)
        out.ends["emitted" if placed.kind == "ends" else placed.kind] += 1
        if placed.kind != "ends":
            if placed.kind == "unknown_conversation":
                log.info("otel.end_of_unknown_conversation")
            return None
        event = self._event(cid, placed.seq, END_DIGEST, end_ns=end.end_ns, agent=end.agent, span=end.span)
        event["type"] = "conversation_end"
        try:
            return self._checked(cid, event)
        except OtelRefused:  # cannot happen for a checked conversation id; kept as a guard
            out.ends["refused"] += 1
            return None

    def _feedback_event(self, fb: FeedbackSpan) -> tuple[bytes, bytes]:
        event: dict[str, object] = {
            "v": 1,
            "conversation_id": fb.conversation_id,
            "event_id": fb.event.event_id,
            "ts": round(fb.event.time_ns / 1e9, 6),
            "type": "feedback",
            "feedback": fb.event.body,
        }
        if fb.agent is not None:
            event["agent"] = fb.agent
        if fb.span is not None:
            event["trace_id"] = fb.span.trace_id
            event["span_id"] = fb.span.span_id
        key = fb.conversation_id.encode("utf-8")
        value = _ENCODER.encode(event)
        try:
            decode_event(value, key, max_bytes=self._max_event_bytes)
        except DecodeError as exc:
            raise OtelRefused("contract_violation", f"feedback: {exc.reason}: {exc.detail}") from None
        return key, value

    @staticmethod
    def _event(
        cid: str, seq: int, digest: bytes, *, end_ns: int, agent: str | None, span: SpanRef | None
    ) -> dict[str, object]:
        event: dict[str, object] = {
            "v": 1,
            "conversation_id": cid,
            "event_id": event_id(cid, seq, digest),
            "seq": seq,
            "ts": round(end_ns / 1e9, 6),
        }
        if agent is not None:
            event["agent"] = agent
        if span is not None:
            event["trace_id"] = span.trace_id
            event["span_id"] = span.span_id
        return event

    def _checked(self, cid: str, event: dict[str, object]) -> tuple[bytes, bytes]:
        key = cid.encode("utf-8")
        value = _ENCODER.encode(event)
        try:
            decode_event(value, key, max_bytes=self._max_event_bytes)
        except DecodeError as exc:
            # Nothing of this span is produced; the next span re-derives the conversation in full.
            self.tracker.forget(cid)
            raise OtelRefused("contract_violation", f"{exc.reason}: {exc.detail}") from None
        return key, value
