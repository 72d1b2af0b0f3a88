"""The sidecar's one retry layer: wait out what can be waited out, with capped, jittered backoff.

:func:`backoff_delay` is the one jitter policy; every retry in the sidecar waits by it.

Every component that must deliver something to the outside and may not lose it (the results and
dead-letter topics, vLLM calls while the server is down, every alert sink) retries through
:func:`until_accepted`. It never gives up on a retryable error: an outage turns into a pending
effect, the processor's bounded pending set fills, and Kafka consumption pauses, which is the
backpressure the operator sees. What is not retryable propagates at once. Cancellation always
propagates. Inside that, one call to a language-model endpoint retries a bounded number of times
behind a circuit breaker (:mod:`sidecar.llm`), with the same delays.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")

RetryHook = Callable[[BaseException, float], None]


def backoff_delay(attempt: int, initial_seconds: float, cap_seconds: float) -> float:
    """The wait before retry number ``attempt`` (1 = the first retry): the sidecar's one jitter policy.

    The nominal delay ``d = min(cap, initial * 2**(attempt - 1))`` doubles per retry up to the cap;
    the wait is uniform in ``[d/2, d]`` ("equal jitter"). Half of it is guaranteed, so ``n``
    attempts always span at least half of the nominal schedule (a bounded retry budget cannot be
    spent in a few milliseconds on a blip), and the other half spreads synchronized clients apart.
    A ``cap`` below ``initial`` caps every delay.
    """
    d = min(cap_seconds, initial_seconds * (2.0 ** min(max(attempt, 1) - 1, 60)))
    return random.uniform(d / 2, d)


class Backoff:
    """Successive delays of :func:`backoff_delay`: ``initial``, doubling up to ``cap``, equal jitter."""

    def __init__(self, initial_seconds: float, cap_seconds: float) -> None:
        if initial_seconds <= 0 or cap_seconds < initial_seconds:
            raise ValueError("backoff needs 0 < initial_seconds <= cap_seconds")
        self._initial = initial_seconds
        self._cap = cap_seconds
        self._attempt = 0

    def delay(self) -> float:
        """The next delay to wait; doubles the one after."""
        self._attempt += 1
        return backoff_delay(self._attempt, self._initial, self._cap)

    def reset(self) -> None:
        self._attempt = 0


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
