"""Who owns each background task, and what readiness says when one dies.

Every long-lived task of the service is started with :func:`spawn` (a component's background
loop) or :meth:`Supervisor.spawn` (the pipeline's own loops in ``run_app``), and is owned by one of:

* the application's :class:`Supervisor`, whose ``asyncio.TaskGroup`` holds every task started
  while :meth:`Supervisor.running` is open: components started inside it (``vllm-health``, the
  clustering scheduler and embed batcher, the alert sinks' connections) have their tasks created
  in that group, so nothing outlives ``run_app``;
* the component itself when it runs on its own (a unit test, an offline tool): the task is then a
  plain named task.

Either way the component keeps the :class:`Supervised` handle and cancels it in ``stop()``; the
supervisor cancels whatever a component left behind when it closes, and makes deaths visible.

A task *dies* when it raises, or when it returns although it should run until cancelled
(``until_cancelled=True``, the default). A death is logged once (``task.died``), kept on the handle
(:attr:`Supervised.death`, which a component's own ``health()`` may read) and, under a supervisor,
fails the ``tasks`` check of ``/readyz`` with the task's name, whatever ``http.readiness`` says: a
dead loop is a fault of this process, not a dependency outage. A task spawned ``fatal`` (the Kafka
source, the loop-lag probe) also ends the application when it raises: the supervisor calls its
``on_fatal`` callback (``run_app`` stops), and :meth:`Supervisor.running` re-raises the exception
once the orderly shutdown is done. Cancellation is never a death and is never swallowed.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextvars import ContextVar
from typing import Final

import structlog

from sidecar.lifecycle import Health

log = structlog.get_logger(__name__)

#: The name of the supervisor's check on ``/readyz`` (it always gates readiness).
TASKS_CHECK: Final = "tasks"

Work = Callable[[], Awaitable[None]]

# The supervisor whose TaskGroup takes the tasks spawned from this context. Set by
# Supervisor.running(); tasks created inside it (the source's workers, which call the hooks) inherit it.
_current: ContextVar[Supervisor | None] = ContextVar("sidecar_supervisor", default=None)


class Supervised:
    """One named background task; :attr:`death` says how it ended, if it ended on its own."""

    __slots__ = ("_task", "death", "error", "name", "until_cancelled")

    def __init__(self, name: str, *, until_cancelled: bool) -> None:
        self.name = name
        self.until_cancelled = until_cancelled
        self.death: str | None = None
        self.error: Exception | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def task(self) -> asyncio.Task[None]:
        assert self._task is not None  # set by the spawner before the handle is handed out
        return self._task

    def done(self) -> bool:
        """True once the task has ended, for whatever reason."""
        return self.task.done()

    def cancel(self) -> None:
        self.task.cancel()

    async def stop(self) -> None:
        """Cancel the task and wait until it has ended.

        Never raises the task's own cancellation or error (a death is already recorded); a
        cancellation of the caller propagates (the task has been asked to stop all the same)."""
        await stop_all([self])

    def _died(self, reason: str, error: Exception | None = None) -> None:
        self.death = reason
        self.error = error


async def stop_all(tasks: Iterable[Supervised]) -> None:
    """Cancel every task first, then wait for all of them (one grace period, not one per task)."""
    pending = {t.task for t in tasks}
    for task in pending:
        task.cancel()
    if pending:
        await asyncio.wait(pending)


async def _watch(handle: Supervised, work: Work, supervisor: Supervisor | None, *, fatal: bool) -> None:
    try:
        await work()
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        handle._died(f"raised {type(exc).__name__}", exc)
        log.exception("task.died", task=handle.name, reason=handle.death)
        if fatal and supervisor is not None:
            supervisor._fatal(exc)
        return
    if handle.until_cancelled:
        handle._died("returned")
        log.error("task.died", task=handle.name, reason=handle.death)


def spawn(name: str, work: Work, *, until_cancelled: bool = True) -> Supervised:
    """Start ``work()`` as the named background task of the calling component.

    Inside a running :class:`Supervisor` the task joins its TaskGroup; otherwise it is a plain task
    that only the component owns. The caller keeps the handle and stops it in its own ``stop()``.
    ``work`` is a coroutine *function*: nothing is created if the task is cancelled before it runs.
    """
    supervisor = _current.get()
    if supervisor is not None and supervisor.accepting:
        return supervisor.spawn(name, work, until_cancelled=until_cancelled)
    handle = Supervised(name, until_cancelled=until_cancelled)
    handle._task = asyncio.create_task(_watch(handle, work, None, fatal=False), name=name)
    return handle


class Supervisor:
    """The application's one TaskGroup, and the ``tasks`` check of ``/readyz``.

    A :class:`~sidecar.lifecycle.HealthReporter`: ready while no supervised task has died; the
    detail names the dead tasks and how they ended (task names are fixed strings, never data).
    """

    def __init__(self, *, on_fatal: Callable[[], None] | None = None) -> None:
        self._on_fatal = on_fatal
        self._tg: asyncio.TaskGroup | None = None
        self._tasks: list[Supervised] = []
        self._fatal_error: Exception | None = None

    @property
    def accepting(self) -> bool:
        """Whether :meth:`spawn` can start a task now (between entering and leaving :meth:`running`)."""
        return self._tg is not None

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Supervisor]:
        """Open the TaskGroup and make it the owner of tasks spawned from this context.

        On the way out, tasks their components did not stop are cancelled and awaited; then the
        first fatal task's exception, if any, is raised."""
        if self._tg is not None:
            raise RuntimeError("Supervisor is already running")
        async with asyncio.TaskGroup() as tg:
            self._tg = tg
            token = _current.set(self)
            try:
                yield self
            finally:
                _current.reset(token)
                self._tg = None
                for handle in self._tasks:
                    if not handle.done():
                        log.warning("task.left_running", task=handle.name)
                        handle.cancel()
        if self._fatal_error is not None:
            raise self._fatal_error

    def spawn(self, name: str, work: Work, *, until_cancelled: bool = True, fatal: bool = False) -> Supervised:
        """Start ``work()`` in the TaskGroup under ``name`` (see the module docstring for ``fatal``)."""
        if self._tg is None:
            raise RuntimeError("Supervisor is not running")
        # Tasks that ended without dying (one-shot tasks, stopped loops) need no more watching.
        self._tasks = [t for t in self._tasks if not t.done() or t.death is not None]
        handle = Supervised(name, until_cancelled=until_cancelled)
        handle._task = self._tg.create_task(_watch(handle, work, self, fatal=fatal), name=name)
        self._tasks.append(handle)
        return handle

    def _fatal(self, error: Exception) -> None:
        if self._fatal_error is None:
            self._fatal_error = error
            if self._on_fatal is not None:
                self._on_fatal()

    def running_names(self) -> list[str]:
        """The names of the supervised tasks still running, sorted (a name may repeat)."""
        return sorted(t.name for t in self._tasks if not t.done())

    def health(self) -> Health:
        dead = [t for t in self._tasks if t.death is not None]
        if dead:
            return Health(TASKS_CHECK, False, "; ".join(f"{t.name} {t.death}" for t in dead))
        running = self.running_names()
        return Health(TASKS_CHECK, True, f"{len(running)} running: {', '.join(running)}")


__all__ = ["TASKS_CHECK", "Supervised", "Supervisor", "Work", "spawn", "stop_all"]
