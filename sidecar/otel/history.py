"""History diffing: which messages of a span's history are new for its conversation.

Every chat span repeats the whole history in its input. The conversation's log (the events already
derived, in ``seq`` order) is append-only; for each span the tracker decides which of its messages
extend it:

* **new** conversation: the whole history, ``seq`` = position in the history;
* the history **extends** the last one seen: the suffix beyond it, ``seq`` continuing the log;
* the history is a **prefix** of the last one seen (a span read late, retried, or from a partition
  behind the others): nothing;
* anything else is a **rewritten** history (an agent that summarised or truncated its context):
  counted, and only the messages after the last one the tracker had already seen become events, at
  the end of the log. Messages that were replaced are never emitted again, so nothing is counted
  twice; when no message is left in common, the new turn (from the last user message on) is kept.

Without a rewrite, ``seq`` is the message's position in the span's history: the same span always
yields the same events (ids included), whatever the tracker remembers, so a re-read or retried span
is dropped by the sidecar's dedup. State is 16 bytes per message plus a small record per
conversation, bounded by ``otel.history`` (count, bytes, idle TTL; least recently seen first).

An end signal (:meth:`HistoryTracker.end`) takes the log's next index, once per conversation, and
only for a conversation the tracker knows: its log's length is what places the end.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from sidecar.otel.messages import DIGEST_BYTES

Kind = Literal["new", "extends", "stale", "rewritten"]
EndKind = Literal["ends", "repeated", "unknown_conversation"]

# A conversation's record: the dict entry, the object and two ints, next to its digests.
_OVERHEAD_BYTES = 200


@dataclass(slots=True)
class _Seen:
    view: bytes  # the digests of the last history seen, concatenated
    next_seq: int  # the log's length: the seq of the next new message
    last_seen: float
    ended_at: int | None = None  # the seq of the conversation_end derived for it


@dataclass(frozen=True, slots=True)
class Diff:
    """What one span adds: ``(seq, index in the span's history)`` for each new message."""

    kind: Kind
    new: tuple[tuple[int, int], ...]
    after_end: bool = False  # new messages for a conversation whose end was already derived


@dataclass(frozen=True, slots=True)
class EndDiff:
    """What an end signal adds: ``seq`` is the end's index when ``kind == "ends"``."""

    kind: EndKind
    seq: int = -1


class HistoryTracker:
    """Per-conversation memory of the derived log; not thread-safe (one event loop owns it)."""

    def __init__(
        self,
        max_conversations: int,
        max_bytes: int,
        idle_ttl_seconds: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._max_conversations = max_conversations
        self._max_bytes = max_bytes
        self._ttl = idle_ttl_seconds
        self._clock = clock
        self._seen: OrderedDict[str, _Seen] = OrderedDict()
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._seen)

    @property
    def state_bytes(self) -> int:
        return self._bytes

    def diff(self, conversation_id: str, digests: Sequence[bytes], user_positions: Sequence[int]) -> Diff:
        """Which of ``digests`` (one per message of the span's history) are new, and their ``seq``.

        ``user_positions``: the indices of the history's user messages (where a new turn can start
        when a rewritten history has nothing in common with what was seen). The new state is kept at
        once; a door whose events then fail to reach Kafka calls :meth:`forget`.
        """
        now = self._clock()
        self._expire(now)
        h = b"".join(digests)
        n = len(digests)
        seen = self._seen.get(conversation_id)
        if seen is None:
            self._store(conversation_id, _Seen(h, n, now))
            return Diff("new", tuple((i, i) for i in range(n)))
        self._seen.move_to_end(conversation_id)
        seen.last_seen = now
        if h.startswith(seen.view):
            known = len(seen.view) // DIGEST_BYTES
            new = tuple((seen.next_seq + j, i) for j, i in enumerate(range(known, n)))
            self._replace(seen, h, seen.next_seq + len(new))
            self._evict(keep=conversation_id)
            return Diff("extends", new, after_end=bool(new) and seen.ended_at is not None)
        if seen.view.startswith(h):
            return Diff("stale", ())
        known_set = {seen.view[k : k + DIGEST_BYTES] for k in range(0, len(seen.view), DIGEST_BYTES)}
        start = next((i + 1 for i in range(n - 1, -1, -1) if digests[i] in known_set), None)
        if start is None:
            start = user_positions[-1] if user_positions else 0
        new = tuple((seen.next_seq + j, i) for j, i in enumerate(range(start, n)))
        self._replace(seen, h, seen.next_seq + len(new))
        self._evict(keep=conversation_id)
        return Diff("rewritten", new, after_end=bool(new) and seen.ended_at is not None)

    def known(self, conversation_id: str, digests: list[bytes]) -> int | None:
        """How many leading messages of this history have already become events (0 for a conversation
        not known here); ``None`` when the history does not extend what was seen. Changes nothing."""
        seen = self._seen.get(conversation_id)
        if seen is None:
            return 0
        if b"".join(digests).startswith(seen.view):
            return len(seen.view) // DIGEST_BYTES
        return None

    def end(self, conversation_id: str) -> EndDiff:
        """Place an end signal: the next index of the log, for a conversation known here.

        ``unknown_conversation``: not seen since the tracker started, or forgotten; no index can be
        placed (the sidecar's state checks ``seq``), so nothing is derived. ``repeated``: its end was
        already derived (a re-read marker, a second signal); nothing more is derived."""
        now = self._clock()
        self._expire(now)
        seen = self._seen.get(conversation_id)
        if seen is None:
            return EndDiff("unknown_conversation")
        self._seen.move_to_end(conversation_id)
        seen.last_seen = now
        if seen.ended_at is not None:
            return EndDiff("repeated")
        seen.ended_at = seen.next_seq
        seen.next_seq += 1
        return EndDiff("ends", seen.ended_at)

    def forget(self, conversation_id: str) -> None:
        """Drop what is known of a conversation: its next span is diffed as a new one."""
        seen = self._seen.pop(conversation_id, None)
        if seen is not None:
            self._bytes -= len(seen.view) + _OVERHEAD_BYTES

    def _store(self, conversation_id: str, seen: _Seen) -> None:
        self._seen[conversation_id] = seen
        self._bytes += len(seen.view) + _OVERHEAD_BYTES
        self._evict(keep=conversation_id)

    def _replace(self, seen: _Seen, view: bytes, next_seq: int) -> None:
        self._bytes += len(view) - len(seen.view)
        seen.view = view
        seen.next_seq = next_seq

    def _expire(self, now: float) -> None:
        while self._seen:
            cid, oldest = next(iter(self._seen.items()))
            if now - oldest.last_seen < self._ttl:
                return
            self.forget(cid)

    def _evict(self, keep: str) -> None:
        while len(self._seen) > 1 and (len(self._seen) > self._max_conversations or self._bytes > self._max_bytes):
            cid = next(iter(self._seen))
            if cid == keep:
                return
            self.forget(cid)
