"""The circuit breaker in front of every OpenAI-compatible endpoint (see :mod:`sidecar.llm.endpoint`)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Literal

BreakerState = Literal["closed", "open", "half_open"]
BREAKER_STATE_VALUE: dict[BreakerState, int] = {"closed": 0, "half_open": 1, "open": 2}


class CircuitBreaker:
    """Opens after ``threshold`` consecutive failures; after ``reset_seconds`` lets one probe through.

    Callers ``await acquire()`` before a request: while the breaker is open this *waits* (it never
    fails fast), which is how an outage turns into backpressure. Exactly one caller at a time is let
    through as the half-open probe; the others wait for its result. A ``threshold`` of 0 never opens.
    """

    def __init__(self, threshold: int, reset_seconds: float) -> None:
        self._threshold = threshold
        self._reset = reset_seconds
        self._failures = 0
        self._opened_at = 0.0
        self._state: BreakerState = "closed"
        self._probe_in_flight = False
        self._changed = asyncio.Event()

    @property
    def state(self) -> BreakerState:
        return self._state

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def acquire(self) -> None:
        """Wait until a request may be sent (closed, or this caller is the half-open probe)."""
        while True:
            if self._state == "closed":
                return
            if self._state == "open":
                remaining = self._opened_at + self._reset - time.monotonic()
                if remaining <= 0:
                    self._state = "half_open"
                    self._probe_in_flight = False
                    self._notify()
                    continue
                waiter = self._changed
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(remaining):
                        await waiter.wait()
                continue
            # half_open
            if not self._probe_in_flight:
                self._probe_in_flight = True
                return
            await self._changed.wait()

    def record_success(self) -> None:
        self._failures = 0
        if self._state != "closed":
            self._state = "closed"
            self._probe_in_flight = False
            self._notify()

    def record_failure(self) -> None:
        self._failures += 1
        if self._threshold <= 0:
            return
        if self._state == "half_open" or self._failures >= self._threshold:
            if self._state != "open":
                self._state = "open"
                self._opened_at = time.monotonic()
                self._probe_in_flight = False
                self._notify()
            else:
                self._opened_at = time.monotonic()

    def release_probe(self) -> None:
        """A probe ended without a verdict (cancelled, permanent error): let another one go."""
        if self._state == "half_open" and self._probe_in_flight:
            self._probe_in_flight = False
            self._notify()
