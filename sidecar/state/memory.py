"""What conversation state costs in memory, and the process-wide budget that bounds it.

Sizes are the allocations themselves (``sys.getsizeof``), not text length: CPython stores a string
in 1, 2 or 4 bytes per character depending on its widest character, so one emoji makes a
1 MB message cost 4 MB, and a million short messages cost their object headers many times over.
The estimate counts every object a message owns (the message, its content, name and tool calls)
plus its slots in the conversation's arrays; small strings shared by interning are counted in
full, so the estimate errs high. ``tests/stream/test_memory.py`` checks it against
``tracemalloc`` and docs/guarantees.md (Bounded memory) against a running process's RSS.
"""

from __future__ import annotations

import sys

from sidecar.transcript.model import Message

# A message's slot in the conversation's message list and its event-id hash in the array.
_PER_MESSAGE_SLOTS = 16
# One open conversation's own objects (the Conversation, its list and array, its entries in the
# partition's dicts) before any message: measured by tests/bench/bench_stream.py at ~1.0 KB.
CONVERSATION_OVERHEAD_BYTES = 1024
# A finished-conversation memory entry: the id string, a dict slot and a heap tuple.
FINISHED_ENTRY_OVERHEAD_BYTES = 160
# One remembered OpenTelemetry span: a list slot, a 2-tuple, the SpanRef and its two hex strings
# (89 + 73 bytes as str objects): about 300 bytes, counted only when the span changes.
SPAN_ENTRY_BYTES = 320
# One remembered feedback id: its hash and an ordered-dict entry (141 bytes measured with
# tracemalloc over 100,000 entries).
FEEDBACK_ENTRY_BYTES = 160


def message_bytes(m: Message) -> int:
    """Bytes the message keeps alive while it is held in a conversation."""
    size = sys.getsizeof(m) + sys.getsizeof(m.content) + _PER_MESSAGE_SLOTS
    if m.name is not None:
        size += sys.getsizeof(m.name)
    if m.tool_calls:
        size += sys.getsizeof(m.tool_calls)
        for c in m.tool_calls:
            size += sys.getsizeof(c) + sys.getsizeof(c.name) + sys.getsizeof(c.arguments)
    return size


def id_bytes(conversation_id: str) -> int:
    return sys.getsizeof(conversation_id)


class MemoryBudget:
    """The bytes all partitions' conversation state may hold together.

    Each :class:`~sidecar.state.store.PartitionState` adds and removes its own bytes here. When
    the total is over ``limit_bytes``, a partition holding more than its fair share
    (``limit_bytes / partitions``) evicts its least recently active conversations until it is back
    under its share or the total is under the limit. A partition is only asked to evict while it
    applies a record or on its periodic sweep, so the total can exceed the limit by at most what
    one record adds plus what the other partitions add until their next sweep (one sweep interval).
    """

    def __init__(self, limit_bytes: int) -> None:
        self.limit_bytes = limit_bytes
        self.used_bytes = 0
        self.partitions = 0

    def join(self) -> None:
        self.partitions += 1

    def leave(self, held_bytes: int) -> None:
        self.partitions = max(0, self.partitions - 1)
        self.used_bytes -= held_bytes

    def add(self, n: int) -> None:
        self.used_bytes += n

    @property
    def over(self) -> bool:
        return self.used_bytes > self.limit_bytes

    @property
    def share_bytes(self) -> float:
        return self.limit_bytes / max(1, self.partitions)
