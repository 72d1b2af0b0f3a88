"""The sidecar's one retry layer: wait out what can be waited out, with capped, jittered backoff.

Every component that must deliver something to the outside and may not lose it (the results and
dead-letter topics, vLLM calls while the server is down, every alert sink) retries through
:func:`until_accepted`. It never gives up on a retryable error: an outage turns into a pending
effect, the processor's bounded pending set fills, and Kafka consumption pauses, which is the
backpressure the operator sees. What is not retryable propagates at once. Cancellation always
propagates.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")

RetryHook = Callable[[BaseException, float], None]


class Backoff:
    """Exponential backoff with jitter: each delay is uniform in [d/2, d], d doubling up to ``cap``."""

    def __init__(self, initial_seconds: float, cap_seconds: float) -> None:
        if initial_seconds <= 0 or cap_seconds < initial_seconds:
            raise ValueError("backoff needs 0 < initial_seconds <= cap_seconds")
        self._initial = initial_seconds
        self._cap = cap_seconds
        self._next = initial_seconds

    def delay(self) -> float:
        """The next delay to wait; doubles the one after."""
        d = self._next
        self._next = min(self._cap, self._next * 2)
        return random.uniform(d / 2, d)

    def reset(self) -> None:
        self._next = self._initial


async def until_accepted(
    call: Callable[[], Awaitable[T]],
    *,
    retryable: Callable[[BaseException], bool],
    on_retry: RetryHook,
    initial_seconds: float,
    cap_seconds: float,
) -> T:
    """Run ``call`` until it returns; retry (after ``on_retry(error, delay)``) while ``retryable``."""
    backoff = Backoff(initial_seconds, cap_seconds)
    while True:
        try:
            return await call()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if not retryable(exc):
                raise
            delay = backoff.delay()
            on_retry(exc, delay)
            await asyncio.sleep(delay)
