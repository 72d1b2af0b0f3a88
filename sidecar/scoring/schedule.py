"""Pacing of scoring work: deterministic sampling, per-agent token budgets, waiting out outages."""

from __future__ import annotations

import asyncio
import hashlib
import random
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

import structlog

from sidecar.errors import RetryableError

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
    """Run ``call`` until it does not raise a retryable error, waiting with capped jittered backoff.

    This is the backpressure path: the caller's awaitable stays pending while vLLM is down or
    saturated (the client's own bounded retry layer and circuit breaker have already given up for
    this round), so the processor's bounded pending-effect set fills up and Kafka is paused.
    Permanent errors and cancellation propagate.
    """
    delay = initial_seconds
    while True:
        try:
            return await call()
        except RetryableError as exc:
            on_wait()
            log.warning("score.waiting_for_vllm", error=type(exc).__name__, delay_seconds=round(delay, 2))
            await asyncio.sleep(random.uniform(delay / 2, delay))
            delay = min(cap_seconds, delay * 2)


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
