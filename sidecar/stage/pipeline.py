"""The post-score stage: every effect goes through its sinks before the results topic records it.

Order of one effect: the hook's outcome is known -> every sink ``offer``s it (metrics, alerts,
goal bookkeeping, ...) -> once all have accepted, the processor writes the outcome to the results
topic, which is the exactly-once journal -> the commit point may pass the triggering record.

So a crash before the journal write re-fires the hook after the restart and the sinks see the
effect again: sinks get at-least-once delivery of every effect, keyed by (conversation, turn,
kind), and the ones that talk to the outside (alert sinks) use that key as their idempotency id.
A crash after it never repeats the effect. While a sink cannot accept (a broker or receiver is
down), its offer stays pending: the effect stays pinned, the partition's pending-effect bound
fills, and consumption pauses, which is the backpressure.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol, runtime_checkable

import structlog

from sidecar.contract import Effect
from sidecar.stage.feedback import FeedbackSink, UncountedFeedback

log = structlog.get_logger(__name__)


@runtime_checkable
class OutcomeSink(Protocol):
    """A consumer of effects. ``offer`` returns None when the effect is accepted at once, else an
    awaitable that completes when it is accepted. It must not raise for bad data (count and drop
    what cannot be used); it may wait as long as its destination is unavailable (backpressure)."""

    name: str

    def offer(self, effect: Effect) -> Awaitable[None] | None: ...


class PostScoreStage:
    """Fans one effect out to every sink; synchronous when every sink answers at once.

    A sink that raises (a bug: sinks handle bad data themselves) is logged and counted through
    ``on_sink_error(name)``, and the effect goes on: one broken sink must not pin a partition.
    Cancellation propagates.
    """

    def __init__(
        self,
        sinks: Sequence[OutcomeSink] = (),
        on_sink_error: SinkErrorCounter | None = None,
        feedback: FeedbackSink | None = None,
    ) -> None:
        self.sinks = tuple(sinks)
        self._on_error = on_sink_error or _ignore
        self.feedback: FeedbackSink = feedback or UncountedFeedback()
        """Where people's feedback takes effect (:mod:`sidecar.stage.feedback`)."""

    def offer(self, effect: Effect) -> Awaitable[None] | None:
        waits: list[Awaitable[None]] = []
        for sink in self.sinks:
            try:
                w = sink.offer(effect)
            except Exception as exc:
                self._failed(sink.name, effect, exc)
                continue
            if w is not None:
                waits.append(self._guarded(sink.name, effect, w))
        if not waits:
            return None
        return _all(waits)

    async def _guarded(self, name: str, effect: Effect, wait: Awaitable[None]) -> None:
        try:
            await wait
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._failed(name, effect, exc)

    def _failed(self, name: str, effect: Effect, exc: Exception) -> None:
        self._on_error(name)
        log.error("stage.sink_failed", sink=name, kind=effect.ctx.kind, error=type(exc).__name__)


SinkErrorCounter = Callable[[str], None]


def _ignore(_name: str) -> None:
    return None


async def _all(waits: Sequence[Awaitable[None]]) -> None:
    if len(waits) == 1:
        await waits[0]
        return
    tasks = [asyncio.ensure_future(w) for w in waits]
    try:
        await asyncio.gather(*tasks)
    except BaseException:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
