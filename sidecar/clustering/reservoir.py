"""A bounded, recency-biased sample of conversation summaries for re-clustering.

Reservoir sampling (Vitter's Algorithm R): the n-th item offered is kept with probability
capacity / n, replacing a uniformly chosen slot, so the reservoir is a uniform sample of everything
offered. To follow a changing mix of goals we want *recent* conversations over-represented:
:meth:`Reservoir.decay` (called after each re-clustering) halves the count of items seen, which
doubles the acceptance rate of what comes next. Items from k re-clusterings ago thus carry about
2^-k of the weight of new ones. Memory is bounded by ``capacity`` whatever the traffic.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt


@dataclass(slots=True)
class ReservoirItem:
    """One conversation's goal summary, its unit embedding, and the completion verdict if known."""

    conversation_id: str
    summary: str
    vector: npt.NDArray[np.float32]
    complete: bool | None = None


class Reservoir:
    """Algorithm R with a decaying seen-count; at most one item per conversation id."""

    def __init__(self, capacity: int, seed: int = 0) -> None:
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        self.capacity = capacity
        self.seen = 0
        self._items: list[ReservoirItem] = []
        self._slot: dict[str, int] = {}
        self._rng = random.Random(seed)

    def __len__(self) -> int:
        return len(self._items)

    def offer(self, item: ReservoirItem) -> bool:
        """Consider ``item``; True if it is now held. A conversation already held is replaced."""
        slot = self._slot.get(item.conversation_id)
        if slot is not None:  # the same conversation again (a hook re-run after a restart)
            self._items[slot] = item
            return True
        self.seen += 1
        if len(self._items) < self.capacity:
            self._slot[item.conversation_id] = len(self._items)
            self._items.append(item)
            return True
        j = self._rng.randrange(self.seen)
        if j >= self.capacity:
            return False
        del self._slot[self._items[j].conversation_id]
        self._items[j] = item
        self._slot[item.conversation_id] = j
        return True

    def get(self, conversation_id: str) -> ReservoirItem | None:
        slot = self._slot.get(conversation_id)
        return None if slot is None else self._items[slot]

    def items(self) -> list[ReservoirItem]:
        """A copy of the held items (safe to use while new ones arrive)."""
        return list(self._items)

    def decay(self) -> None:
        """Halve the weight of the past (never below the number of items held)."""
        self.seen = max(len(self._items), self.seen // 2)
