"""Deriving events off the event loop: one derivation at a time per ingest, in a worker thread.

Turning a large payload into events is seconds of CPU (40,000 chat spans take about ten); on the
event loop it would stall every other request, the liveness probe and the Kafka consumer's
heartbeats. Both doors hand their work to the :class:`IngestWork` of their shared
:class:`~sidecar.otel.ingest.OtelIngest`, which runs it in a worker thread (the interpreter switches
back to the loop every few milliseconds) and one at a time, so the history tracker only ever sees
one derivation. A caller may give a time budget: past it, the caller gets
:class:`~sidecar.otel.errors.OtelRefused` (``over_budget``) at once; the work, which a thread cannot
be made to drop, finishes in the background holding the lock, and what it derived is handed to
``abandon`` (the receiver forgets those conversations, as after a failed produce, so a retry
re-derives them in full).

**Garbage collection.** A derivation makes millions of short-lived objects. While they live,
CPython's automatic collector would run several full collections, each walking every object of the
process with the interpreter held (measured: pauses of 0.2 to 0.7 s on the loop for 40,000 spans).
The collector is therefore paused while a derivation runs and resumed when it ends: its objects are
freed by reference counting as it returns, and a later collection finds little left to walk.
"""

from __future__ import annotations

import asyncio
import gc
import threading
import weakref
from collections.abc import Callable
from typing import TypeVar

from sidecar.otel.errors import OtelRefused
from sidecar.otel.ingest import OtelIngest

T = TypeVar("T")

_WORK: weakref.WeakKeyDictionary[OtelIngest, IngestWork] = weakref.WeakKeyDictionary()


class _GcPause:
    """Automatic garbage collection off while any derivation runs (derivations of several ingests
    may overlap); back to what it was when the last one ends."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running = 0
        self._was_enabled = False

    def __enter__(self) -> None:
        with self._lock:
            if self._running == 0:
                self._was_enabled = gc.isenabled()
                gc.disable()
            self._running += 1

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            self._running -= 1
            if self._running == 0 and self._was_enabled:
                gc.enable()


_GC_PAUSE = _GcPause()


def _without_gc(work: Callable[[], T]) -> T:
    with _GC_PAUSE:
        return work()


class IngestWork:
    """The one queue of derivations of an ingest."""

    def __init__(self) -> None:
        self._lock = asyncio.Lock()

    @property
    def busy(self) -> bool:
        return self._lock.locked()

    async def run(
        self, work: Callable[[], T], *, budget_seconds: float | None = None, abandon: Callable[[T], None] | None = None
    ) -> T:
        """``work()`` in a worker thread once the previous derivation has ended; its result or its
        exception. Over ``budget_seconds`` (or cancelled), raises without waiting for it."""
        await self._lock.acquire()
        future = asyncio.get_running_loop().run_in_executor(None, _without_gc, work)
        try:
            done, _ = await asyncio.wait({future}, timeout=budget_seconds)
        except BaseException:
            self._release_when_done(future, abandon)
            raise
        if not done:
            self._release_when_done(future, abandon)
            raise OtelRefused("over_budget", f"not derived within {budget_seconds}s; retry later or send less")
        self._lock.release()
        return future.result()

    def _release_when_done(self, future: asyncio.Future[T], abandon: Callable[[T], None] | None) -> None:
        def finished(f: asyncio.Future[T]) -> None:
            try:
                if abandon is not None and not f.cancelled() and f.exception() is None:
                    abandon(f.result())
            finally:
                self._lock.release()

        future.add_done_callback(finished)


def work_for(ingest: OtelIngest) -> IngestWork:
    """The ingest's one :class:`IngestWork`, shared by every door that uses it."""
    work = _WORK.get(ingest)
    if work is None:
        work = _WORK[ingest] = IngestWork()
    return work
