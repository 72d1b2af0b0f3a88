"""The lifecycle every long-lived component shares."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable


@runtime_checkable
class Component(Protocol):
    """A piece of the pipeline with a start/stop lifecycle.

    Guarantees: ``start()`` returns quickly (long work goes into tasks the caller supervises);
    ``stop()`` is idempotent and safe to call without a prior ``start()``; neither swallows
    ``asyncio.CancelledError``.
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
