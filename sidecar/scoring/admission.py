"""Admission of vLLM requests: which of one client's requests may be in flight together.

``IsolationGate``: a request admitted ``exclusive`` runs with no other request of the gate in
flight (ordinary ones wait while it waits or runs; exclusive ones take turns).

``all_or_nothing``: requests sent together, and none left in flight when one of them fails.

``LaneGate``: requests of different lanes are never in flight at the same time. A lane is a
family of requests that may share a server batch with each other but not with another lane's; the
vLLM client uses two, the base model and its LoRA adapters (see ``scoring.vllm.mixed_batches``).
Guarantees, for the requests of one gate (one process's client; requests of other processes are not
ordered by it):

* **Exclusion**: while a request of lane A is admitted, no request of another lane is.
* **Sharing**: requests of the lane that holds the gate enter at once, as long as no other lane
  waits, so a lane alone loses no concurrency.
* **Fairness, no starvation**: once another lane waits, the holding lane admits no newcomer; when
  its requests in flight are done, the gate passes to the lane whose oldest waiter has waited
  longest (never back to the lane that just held it while another waits) and admits all that
  lane's waiters at once. So with two lanes they alternate; with more, every turn the gate passes
  serves a waiter older than any still waiting in a lane that is not holding, so each waiter's
  wait is bounded by the turns of the waiters older than it.
* **Cancellation**: a waiter cancelled before admission leaves the queue (and may unblock the lane
  it held back); one cancelled after admission, or an admitted request that ends in any way,
  releases its place. ``CancelledError`` is always re-raised.
* ``enabled=False`` makes every lane enter at once (no ordering at all).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections import deque
from collections.abc import AsyncIterator, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

T = TypeVar("T")


async def all_or_nothing(calls: Sequence[Coroutine[Any, Any, T]]) -> list[T]:
    """Run ``calls`` together; on the first failure cancel the rest and raise that failure as is."""
    tasks = [asyncio.ensure_future(c) for c in calls]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


@dataclass(slots=True)
class _Waiter:
    seq: int
    granted: asyncio.Future[None] = field(default_factory=lambda: asyncio.get_running_loop().create_future())


class LaneGate:
    """Mutual exclusion between lanes, shared admission within one (see the module docstring)."""

    def __init__(self, *, enabled: bool = True) -> None:
        self.enabled = enabled
        self._holder: str | None = None
        self._in_flight = 0
        self._queues: dict[str, deque[_Waiter]] = {}
        self._seq = itertools.count()
        self.switches = 0  # how many times the gate passed from one lane to another

    @property
    def holder(self) -> str | None:
        """The lane whose requests may be in flight now (None: the gate is free)."""
        return self._holder

    @property
    def in_flight(self) -> int:
        """Requests admitted and not yet released."""
        return self._in_flight

    def waiting(self, lane: str) -> int:
        """Requests of ``lane`` waiting for admission."""
        return len(self._queues.get(lane, ()))

    @contextlib.asynccontextmanager
    async def lane(self, name: str) -> AsyncIterator[None]:
        """Hold a place in lane ``name`` for the body of the ``async with``."""
        if not self.enabled:
            yield
            return
        await self._acquire(name)
        try:
            yield
        finally:
            self._release()

    def _others_wait(self, lane: str) -> bool:
        return any(q for name, q in self._queues.items() if name != lane)

    async def _acquire(self, lane: str) -> None:
        free = self._holder is None
        if free or (self._holder == lane and not self._queues.get(lane) and not self._others_wait(lane)):
            self._holder = lane
            self._in_flight += 1
            return
        waiter = _Waiter(next(self._seq))
        self._queues.setdefault(lane, deque()).append(waiter)
        try:
            await waiter.granted
        except asyncio.CancelledError:
            if waiter.granted.done() and not waiter.granted.cancelled():
                self._release()  # admitted, then cancelled before it could run: give the place back
            else:
                with contextlib.suppress(ValueError):  # a dispatch may have purged it already
                    self._queues[lane].remove(waiter)
                self._dispatch()
            raise

    def _release(self) -> None:
        self._in_flight -= 1
        self._dispatch()

    def _dispatch(self) -> None:
        """Admit whoever may enter now (called whenever the in-flight count or a queue shrinks)."""
        for queue in self._queues.values():  # waiters cancelled but not yet resumed are not waiting
            for gone in [w for w in queue if w.granted.cancelled()]:
                queue.remove(gone)
        if self._in_flight == 0:
            nxt = self._next_lane()
            if nxt is None:
                self._holder = None
                return
            if self._holder is not None and nxt != self._holder:
                self.switches += 1
            self._holder = nxt
            self._grant_all(nxt)
        elif self._holder is not None and not self._others_wait(self._holder):
            # A waiter of another lane left (cancelled): the holder's own newcomers need not wait.
            self._grant_all(self._holder)

    def _next_lane(self) -> str | None:
        """The waiting lane with the oldest waiter, the lane that just held the gate last."""
        waiting = [(q[0].seq, name) for name, q in self._queues.items() if q]
        if not waiting:
            return None
        others = [w for w in waiting if w[1] != self._holder]
        return min(others or waiting)[1]

    def _grant_all(self, lane: str) -> None:
        queue = self._queues.get(lane)
        while queue:
            waiter = queue.popleft()
            self._in_flight += 1
            waiter.granted.set_result(None)


class IsolationGate:
    """Shared admission for ordinary requests, sole admission for exclusive ones (see above)."""

    def __init__(self) -> None:
        self._active = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._open = asyncio.Event()
        self._open.set()
        self._exclusive = asyncio.Lock()

    @contextlib.asynccontextmanager
    async def admitted(self, *, exclusive: bool = False) -> AsyncIterator[None]:
        """Hold a shared (or, with ``exclusive``, the sole) place for the body of the ``async with``."""
        if exclusive:
            async with self._exclusive:
                self._open.clear()
                try:
                    await self._idle.wait()
                    yield
                finally:
                    self._open.set()
            return
        while not self._open.is_set():
            await self._open.wait()
        self._active += 1
        self._idle.clear()
        try:
            yield
        finally:
            self._active -= 1
            if self._active == 0:
                self._idle.set()
