"""Many simulated conversations at once, streamed as contract-v1 events while they unfold.

``concurrency`` workers take goals in file order; each runs one :class:`Dialogue` at a time and
emits every message as an event the moment it exists (and ``conversation_end`` when the dialogue
ends), through one :class:`RatePacer` shared by the run. So the writer sees what a live agent
produces: interleaved conversations, each in order, never faster than ``rate`` events per second.
A conversation that failed before its first message emits nothing (a lone end event would only be
dead-lettered).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sidecar.tools.demo.replay import conversation_events
from sidecar.tools.simulator.dialogue import END_REASONS, ROLES, Dialogue, SimulatedConversation
from sidecar.tools.simulator.goals import GoalSpec
from sidecar.tools.simulator.metrics import SimulatorMetrics
from sidecar.tools.simulator.writers import EventWriter, RatePacer
from sidecar.transcript.model import Message


@dataclass(frozen=True, slots=True)
class RunPlan:
    """Who the conversations are attributed to, and how fast and how many at once."""

    agent: str
    tenant: str | None
    concurrency: int
    rate: float | None
    id_prefix: str


class ConversationEmitter:
    """One conversation's events, built by the demo replay's encoder as its messages arrive."""

    def __init__(
        self, conversation_id: str, plan: RunPlan, writer: EventWriter, pacer: RatePacer, metrics: SimulatorMetrics
    ) -> None:
        self.conversation_id = conversation_id
        self._agent = plan.agent
        self._tenant = plan.tenant
        self._writer = writer
        self._pacer = pacer
        self._metrics = metrics
        self._turns: list[dict[str, Any]] = []
        self.sent = 0

    def _events(self, end: bool) -> list[dict[str, Any]]:
        record = {"conversation_id": self.conversation_id, "turns": self._turns}
        return conversation_events(record, agent=self._agent, tenant=self._tenant, end=end)

    async def _emit(self, event: Mapping[str, Any]) -> None:
        await self._pacer.wait()
        await self._writer.send({**event, "ts": time.time()})
        self.sent += 1
        self._metrics.events.inc()

    async def message(self, m: Message) -> None:
        self._turns.append({"role": m.role, "content": m.content})
        for event in self._events(end=False)[self.sent :]:
            await self._emit(event)

    async def end(self) -> None:
        if self._turns:
            await self._emit(self._events(end=True)[-1])


async def simulate_all(
    goals: Sequence[GoalSpec], dialogue: Dialogue, writer: EventWriter, plan: RunPlan, metrics: SimulatorMetrics
) -> list[SimulatedConversation]:
    """Simulate one conversation per goal (results in goal order); the writer must be started."""
    pacer = RatePacer(plan.rate)
    results: list[SimulatedConversation | None] = [None] * len(goals)
    queue = iter(enumerate(goals))

    async def worker() -> None:
        for i, goal in queue:
            cid = f"{plan.id_prefix}{i:06d}"
            emitter = ConversationEmitter(cid, plan, writer, pacer, metrics)
            conv = await dialogue.run(goal, cid, emitter.message)
            await emitter.end()
            _observe(metrics, conv)
            results[i] = conv

    async with asyncio.TaskGroup() as tg:
        for _ in range(min(plan.concurrency, len(goals))):
            tg.create_task(worker())
    return [r for r in results if r is not None]


def _observe(metrics: SimulatorMetrics, conv: SimulatedConversation) -> None:
    metrics.conversations.labels(conv.end_reason).inc()
    metrics.turns.observe(conv.turns)
    metrics.invalid_checks.inc(conv.invalid_checks)
    for role, cost in conv.costs.items():
        metrics.calls.labels(role).inc(cost.calls)
        metrics.tokens.labels(role, "prompt").inc(cost.prompt_tokens)
        metrics.tokens.labels(role, "completion").inc(cost.completion_tokens)


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def run_summary(convs: Sequence[SimulatedConversation], events: int, wall_seconds: float) -> dict[str, Any]:
    """The run in figures: end reasons, turns, summaries and their mean ROUGE, cost per role."""
    n = len(convs)
    scored = [s for s in (c.rouge() for c in convs) if s is not None]
    mean_rouge = (
        {
            variant: {k: _mean([s[variant][k] for s in scored]) for k in ("precision", "recall", "fmeasure")}
            for variant in ("rouge1", "rouge2", "rougeL")
        }
        if scored
        else None
    )
    cost = {
        r: {
            "calls": sum(c.costs[r].calls for c in convs),
            "prompt_tokens": sum(c.costs[r].prompt_tokens for c in convs),
            "completion_tokens": sum(c.costs[r].completion_tokens for c in convs),
        }
        for r in ROLES
    }
    return {
        "conversations": n,
        "end_reasons": {r: sum(1 for c in convs if c.end_reason == r) for r in END_REASONS},
        "turns": {"mean": _mean([c.turns for c in convs]), "max": max((c.turns for c in convs), default=0)},
        "with_summary": sum(1 for c in convs if c.summary is not None),
        "summary_accepted": sum(1 for c in convs if c.summary_accepted),
        "invalid_checks": sum(c.invalid_checks for c in convs),
        "rouge_mean": mean_rouge,
        "events": events,
        "cost": cost,
        "cost_per_conversation": {r: {k: v / n for k, v in cost[r].items()} if n else None for r in ROLES},
        "wall_seconds": round(wall_seconds, 3),
    }
