"""The post-score sink every results-out destination is: map the effect, queue it, wait for it.

A destination module gives a name, its HTTP endpoints and ``send(batch)``; :class:`ResultsSink`
makes it an :class:`~sidecar.stage.pipeline.OutcomeSink`, a component and a health reporter.
Requests go through the alert sinks' :class:`~sidecar.alerting.sinks._http.HttpDestination`, so
every HTTP destination of the sidecar classifies answers the same way (2xx accepted; 408, 429,
5xx, timeouts and transport errors retried; other 4xx refused, never re-sent; redirects never
followed; response bodies never read).
"""

from __future__ import annotations

from collections.abc import Awaitable, Sequence

from sidecar.alerting.sinks._http import HttpDestination
from sidecar.contract import Effect
from sidecar.evaluations.config import DeliveryConfig
from sidecar.evaluations.delivery import BatchDelivery
from sidecar.evaluations.metrics import EvaluationMetrics
from sidecar.evaluations.results import EvaluationResult, evaluation_results
from sidecar.lifecycle import Health

USER_AGENT = "llm-agent-sidecar-evaluations/1"


class ResultsSink:
    """Base of the OTLP, Langfuse and Phoenix sinks; subclasses implement :meth:`send`."""

    name = "results"

    def __init__(
        self,
        destinations: Sequence[HttpDestination],
        delivery: DeliveryConfig,
        metrics: EvaluationMetrics,
        *,
        include_text: bool,
    ) -> None:
        self._destinations = tuple(destinations)
        self._include_text = include_text
        self.delivery = BatchDelivery(self.name, self.send, delivery, metrics)
        metrics.sink_up.labels(self.name).set_function(lambda: 1.0 if self.health().ready else 0.0)

    async def send(self, batch: Sequence[EvaluationResult]) -> None:
        """Deliver ``batch``; returns once accepted, else raises (retryable or permanent)."""
        raise NotImplementedError

    def offer(self, effect: Effect) -> Awaitable[None] | None:
        return self.delivery.submit(evaluation_results(effect, include_text=self._include_text))

    async def start(self) -> None:
        for d in self._destinations:
            await d.start()
        await self.delivery.start()

    async def stop(self) -> None:
        await self.delivery.stop()
        for d in self._destinations:
            await d.stop()

    def health(self) -> Health:
        task = self.delivery.task
        if task is not None and task.done():
            return Health(self.name, False, f"delivery task ended: {task.death or 'stopped'}")
        for d in self._destinations:
            h = d.health()
            if not h.ready:
                return Health(self.name, False, h.detail)
        return Health(self.name, True, f"{self.delivery.queued} results queued")
