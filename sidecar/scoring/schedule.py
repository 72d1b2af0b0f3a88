"""Pacing of scoring work: deterministic sampling, per-agent token budgets, waiting out outages."""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

import structlog

from sidecar.errors import RetryableError
from sidecar.retry import until_accepted

log = structlog.get_logger()
T = TypeVar("T")
K = TypeVar("K")


def sampled(rate: float, *key: object) -> bool:
    """Whether ``key`` falls in the sample; the same key always gets the same answer.

    Deterministic on purpose: a hook re-run after a crash must make the same decision, or the
    exactly-once bookkeeping would record a score for a turn that was skipped before (or not).
    """
    if rate >= 1.0:
        return True
    if rate <= 0.0:
        return False
    digest = hashlib.blake2b(repr(key).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64 < rate


class TokenBucket:
    """A generated-token budget refilled continuously at ``per_minute`` (0 = unlimited)."""

    def __init__(self, per_minute: int) -> None:
        self.per_minute = per_minute
        self._tokens = float(per_minute)
        self._at = time.monotonic()

    def _refill(self) -> None:
        now = time.monotonic()
        self._tokens = min(float(self.per_minute), self._tokens + (now - self._at) * self.per_minute / 60.0)
        self._at = now

    def available(self) -> bool:
        if self.per_minute <= 0:
            return True
        self._refill()
        return self._tokens > 0

    def spend(self, tokens: int) -> None:
        if self.per_minute > 0:
            self._refill()
            self._tokens -= tokens


async def until_available(
    call: Callable[[], Awaitable[T]],
    *,
    on_wait: Callable[[], None],
    initial_seconds: float = 0.5,
    cap_seconds: float = 15.0,
) -> T:
    """Run ``call`` until it does not raise a retryable error (the shared retry layer,
    :func:`sidecar.retry.until_accepted`).

    This is the backpressure path: the caller's awaitable stays pending while vLLM is down or
    saturated (the client's own bounded retry layer and circuit breaker have already given up for
    this round), so the processor's bounded pending-effect set fills up and Kafka is paused.
    Permanent errors and cancellation propagate.
    """

    def waiting(exc: BaseException, delay: float) -> None:
        on_wait()
        log.warning("score.waiting_for_vllm", error=type(exc).__name__, delay_seconds=round(delay, 2))

    return await until_accepted(
        call,
        retryable=lambda exc: isinstance(exc, RetryableError),
        on_retry=waiting,
        initial_seconds=initial_seconds,
        cap_seconds=cap_seconds,
    )


class LruCache(Generic[K, T]):
    """A small bounded mapping that forgets the least recently used entry."""

    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        self._data: OrderedDict[K, T] = OrderedDict()

    def get(self, key: K) -> T | None:
        value = self._data.get(key)
        if value is not None:
            self._data.move_to_end(key)
        return value

    def put(self, key: K, value: T) -> None:
        self._data[key] = value
        self._data.move_to_end(key)
        while len(self._data) > self._capacity:
            self._data.popitem(last=False)

    def __len__(self) -> int:
        return len(self._data)


class Slots:
    """At most ``n`` holders at once; waiters are served newest first (``lifo``) or oldest first.

    Under overload a response tree is worth computing only while the agent is still answering:
    serving the newest waiting tree first keeps fresh turns fresh, and the stale ones left at the
    bottom are shed by their staleness check when they finally get a slot. Cancellation-safe: a
    waiter cancelled after being handed a slot passes it on.
    """

    def __init__(self, n: int, *, lifo: bool = False) -> None:
        if n < 1:
            raise ValueError("n must be at least 1")
        self._free = n
        self._lifo = lifo
        self._waiters: deque[asyncio.Future[None]] = deque()

    @property
    def waiting(self) -> int:
        return sum(1 for w in self._waiters if not w.done())

    async def acquire(self) -> None:
        if self._free > 0 and not self.waiting:
            self._free -= 1
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self.release()  # we were handed the slot as we got cancelled: pass it on
            raise

    def release(self) -> None:
        while self._waiters:
            fut = self._waiters.pop() if self._lifo else self._waiters.popleft()
            if not fut.done():
                fut.set_result(None)
                return
        self._free += 1

    async def __aenter__(self) -> None:
        await self.acquire()

    async def __aexit__(self, *exc: object) -> None:
        self.release()
