"""The delivery every results-out sink shares: a bounded queue, batches, the one retry layer.

:meth:`BatchDelivery.submit` queues an effect's results and returns an awaitable that completes
once the destination has accepted every one of them, or refused one for good (counted): the
post-score stage waits on it, so the effect is journaled, and the commit passes it, only after
that. A crash before it shows the effect again after the restart and the same records go out with
the same ids (:mod:`sidecar.evaluations.results`): receivers keep one copy.

One task (``evaluations-<sink>``, owned by the supervisor) takes up to ``max_batch_records``
records, waiting ``flush_seconds`` for a partial batch to fill, and hands them to the sink's
``send(batch)``. That raises :class:`~sidecar.errors.RetryableError` (the destination is down,
slow, 408/429/5xx) or :class:`~sidecar.errors.PermanentError`; retryable failures are retried
through :func:`sidecar.retry.until_accepted` for as long as it takes (the queue then fills,
``submit`` waits for room, effects stay pinned and consumption pauses: backpressure, nothing
lost). A batch refused as too large (HTTP 413) is split in halves and each half sent on its own;
a single record refused for good is dropped and counted with the reason. Records of an effect that
was abandoned meanwhile (its awaitable cancelled on a revoke or a stop) are not sent.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

import structlog

from sidecar.errors import RetryableError
from sidecar.evaluations.config import DeliveryConfig
from sidecar.evaluations.metrics import EvaluationMetrics
from sidecar.evaluations.results import EvaluationResult
from sidecar.retry import until_accepted
from sidecar.supervision import Supervised, spawn

log = structlog.get_logger(__name__)

SendBatch = Callable[[Sequence[EvaluationResult]], Awaitable[None]]
TOO_LARGE = "HTTP 413"


@dataclass(slots=True)
class _Pending:
    """The results of one effect and the future its effect waits on."""

    results: list[EvaluationResult]
    done: asyncio.Future[None]
    left: int = field(init=False)

    def __post_init__(self) -> None:
        self.left = len(self.results)

    def settle(self, n: int = 1) -> None:
        self.left -= n
        if self.left <= 0 and not self.done.done():
            self.done.set_result(None)


class BatchDelivery:
    """Bounded queue + one sending task for one sink; see the module docstring."""

    def __init__(self, sink: str, send: SendBatch, cfg: DeliveryConfig, metrics: EvaluationMetrics) -> None:
        self.sink = sink
        self._send = send
        self._cfg = cfg
        self._metrics = metrics
        self._queue: deque[tuple[EvaluationResult, _Pending]] = deque()
        self._room = asyncio.Condition()
        self._ready = asyncio.Event()
        self._task: Supervised | None = None
        metrics.queue.labels(sink).set_function(lambda: len(self._queue))

    @property
    def queued(self) -> int:
        return len(self._queue)

    async def start(self) -> None:
        if self._task is None:
            self._task = spawn(f"evaluations-{self.sink}", self._run)

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            await task.stop()
        # Whatever is left was never accepted: its effects are not journaled and fire again.
        while self._queue:
            _, pending = self._queue.popleft()
            pending.done.cancel()

    @property
    def task(self) -> Supervised | None:
        return self._task

    def submit(self, results: Sequence[EvaluationResult]) -> Awaitable[None] | None:
        """Queue ``results``; the awaitable completes once each is accepted or refused for good."""
        if not results:
            return None
        pending = _Pending(list(results), asyncio.get_running_loop().create_future())
        return self._enqueue(pending)

    async def _enqueue(self, pending: _Pending) -> None:
        if self._task is None:
            raise RuntimeError(f"evaluations sink {self.sink} is not started")
        async with self._room:
            for result in pending.results:
                await self._room.wait_for(lambda: len(self._queue) < self._cfg.max_queue_records)
                self._queue.append((result, pending))
                self._ready.set()
        await pending.done

    # -- the sending task -------------------------------------------------------------------

    async def _run(self) -> None:
        cfg = self._cfg
        while True:
            await self._ready.wait()
            if len(self._queue) < cfg.max_batch_records and cfg.flush_seconds > 0:
                deadline = time.monotonic() + cfg.flush_seconds
                while len(self._queue) < cfg.max_batch_records and (left := deadline - time.monotonic()) > 0:
                    self._ready.clear()
                    try:
                        async with asyncio.timeout(left):
                            await self._ready.wait()
                    except TimeoutError:
                        break
            batch = [self._queue.popleft() for _ in range(min(cfg.max_batch_records, len(self._queue)))]
            if not self._queue:
                self._ready.clear()
            async with self._room:
                self._room.notify_all()
            live = [(r, p) for r, p in batch if not p.done.done()]  # abandoned effects are not sent
            if live:
                await self._deliver(live)

    async def _deliver(self, batch: list[tuple[EvaluationResult, _Pending]]) -> None:
        try:
            await self._until_accepted([r for r, _ in batch])
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # refused for good (or a sink bug): counted, the effects go on
            reason = _reason(exc)
            if reason == TOO_LARGE and len(batch) > 1:
                half = len(batch) // 2
                log.info("evaluations.batch_split", sink=self.sink, records=len(batch))
                await self._deliver(batch[:half])
                await self._deliver(batch[half:])
                return
            self._metrics.failed.labels(self.sink, _label(reason)).inc(len(batch))
            log.error("evaluations.rejected", sink=self.sink, records=len(batch), error=reason)  # noqa: TRY400
            for _, pending in batch:
                pending.settle()
            return
        self._metrics.delivered.labels(self.sink).inc(len(batch))
        for _, pending in batch:
            pending.settle()

    async def _until_accepted(self, results: list[EvaluationResult]) -> None:
        def retrying(exc: BaseException, delay: float) -> None:
            self._metrics.retries.labels(self.sink, _label(_reason(exc))).inc()
            log.warning(
                "evaluations.delivery_retry",
                sink=self.sink,
                records=len(results),
                error=_reason(exc),
                retry_in_seconds=round(delay, 2),
            )

        retry = self._cfg.retry
        await until_accepted(
            lambda: self._send(results),
            retryable=lambda exc: isinstance(exc, RetryableError),
            on_retry=retrying,
            initial_seconds=retry.initial_backoff_seconds,
            cap_seconds=retry.max_backoff_seconds,
        )


def _reason(exc: BaseException) -> str:
    reason = getattr(exc, "reason", None)
    return reason if isinstance(reason, str) else type(exc).__name__


def _label(reason: str) -> str:
    """A closed label set: ``http_<status>``, ``timeout``, ``transport``, ``invalid_url`` or ``error``."""
    if reason.startswith("HTTP ") and reason[5:].isdigit():
        return f"http_{reason[5:]}"
    if reason.startswith("timeout"):
        return "timeout"
    if reason == "invalid URL":
        return "invalid_url"
    if reason.endswith("Error") or reason in {"not started", "sink not started"}:
        return "transport"
    return "error"
