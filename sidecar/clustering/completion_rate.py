"""Completion rate per goal: verdicts counted toward the cluster their conversation was assigned to.

Whoever knows a conversation's completion verdict calls :meth:`CompletionRates.record_outcome`,
before or after the conversation was assigned to a cluster (both orders count it once). A
cluster's counts cover the reservoir sample at the last re-clustering (each held summary carries
its verdict, stamped here) plus every verdict recorded since. Verdicts recorded before a
re-clustering are never counted again after it: they are in the sample or they were left out of it.

Memory is bounded: at most ``capacity`` conversations are remembered, least recently touched first
out (a verdict for a forgotten conversation is simply not counted).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass

from sidecar.clustering.reservoir import Reservoir


@dataclass(slots=True)
class _Conversation:
    cluster_id: str | None = None
    complete: bool | None = None
    counted: bool = False


class CompletionRates:
    """Complete/incomplete counts per live cluster id, and the verdicts of the reservoir sample."""

    def __init__(self, capacity: int, reservoir: Reservoir) -> None:
        self._capacity = capacity
        self._reservoir = reservoir
        self._conversations: OrderedDict[str, _Conversation] = OrderedDict()
        # Live cluster id -> [complete, incomplete]; only the live clusters have an entry.
        self._counts: dict[str, list[int]] = {}

    def record_outcome(self, conversation_id: str, complete: bool | None) -> None:
        """The completion verdict of a conversation (None: unknown, never counted)."""
        conv = self._conversation(conversation_id)
        conv.complete = complete
        item = self._reservoir.get(conversation_id)
        if item is not None:
            item.complete = complete
        self._count(conv)

    def assigned(self, conversation_id: str, cluster_id: str | None) -> None:
        """The conversation was assigned to ``cluster_id`` (None: to no cluster); a verdict known
        already is counted now and stamped on its reservoir item."""
        conv = self._conversation(conversation_id)
        conv.cluster_id = cluster_id
        if conv.complete is not None:
            item = self._reservoir.get(conversation_id)
            if item is not None:
                item.complete = conv.complete
        self._count(conv)

    def restart(self, cluster_ids: Iterable[str], sample: Iterable[tuple[str, bool | None]]) -> None:
        """New live clusters: counts start from the verdicts of the re-clustered ``sample``
        (pairs of the new cluster id and the verdict of one held conversation)."""
        counts: dict[str, list[int]] = {cid: [0, 0] for cid in cluster_ids}
        for cid, complete in sample:
            if complete is not None:
                counts[cid][0 if complete else 1] += 1
        self._counts = counts
        for conv in self._conversations.values():
            conv.counted = conv.counted or conv.complete is not None

    def counts(self, cluster_id: str) -> tuple[int, int]:
        """``(complete, incomplete)`` of a live cluster (zeros for any other id)."""
        complete, incomplete = self._counts.get(cluster_id, (0, 0))
        return complete, incomplete

    def _conversation(self, conversation_id: str) -> _Conversation:
        conv = self._conversations.get(conversation_id)
        if conv is None:
            conv = self._conversations[conversation_id] = _Conversation()
            while len(self._conversations) > self._capacity:
                self._conversations.popitem(last=False)
        else:
            self._conversations.move_to_end(conversation_id)
        return conv

    def _count(self, conv: _Conversation) -> None:
        cid = conv.cluster_id
        if conv.counted or conv.complete is None or cid is None or cid not in self._counts:
            return
        self._counts[cid][0 if conv.complete else 1] += 1
        conv.counted = True
