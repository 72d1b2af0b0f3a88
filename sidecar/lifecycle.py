"""The lifecycle every long-lived component shares."""

from __future__ import annotations

import signal
from dataclasses import dataclass
from types import FrameType
from typing import Protocol, runtime_checkable

# SIGTERM/SIGINT received before the event loop took over the signals (while the process was
# still importing and building its components). Set by the handler :func:`catch_early_stop`
# installs; the running app reads it once its own handlers are in place.
_early_stop: list[int] = []


def _remember(signum: int, _frame: FrameType | None) -> None:
    _early_stop.append(signum)


def catch_early_stop() -> None:
    """Install, as the very first thing a process does, a handler that only remembers SIGTERM and
    SIGINT: a stop asked for during start-up (imports alone take seconds on a loaded node) then
    ends the process cleanly, exit code 0, instead of killing it half-started."""
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _remember)


def stop_requested_early() -> bool:
    return bool(_early_stop)


@runtime_checkable
class Component(Protocol):
    """A piece of the pipeline with a start/stop lifecycle.

    Guarantees: ``start()`` returns quickly (long work goes into named tasks started with
    :func:`sidecar.supervision.spawn`, which the application's supervisor owns); ``stop()`` is
    idempotent, safe to call without a prior ``start()``, and leaves no task of the component
    running; neither swallows ``asyncio.CancelledError``.
    """

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


@dataclass(frozen=True, slots=True)
class Health:
    """One dependency's readiness as shown on ``/readyz``; ``detail`` never holds secrets."""

    name: str
    ready: bool
    detail: str = ""


@runtime_checkable
class HealthReporter(Protocol):
    """Anything whose state should gate readiness (Kafka assignment, vLLM, MQTT...)."""

    def health(self) -> Health: ...
