"""Escalations: the post-score stage's sink that turns scored effects into alerts and delivers them.

For every effect (one hook call of one conversation, with the typed events its scorers found):

* a response tree (``user_message``) is judged by the agent's uncertainty policy
  (:mod:`sidecar.alerting.policy`); flagged turns are counted in ``sidecar_uncertain_turns_total``
  and become ``uncertain_turn`` alerts;
* a final verdict of "incomplete" (``conversation_ended``) becomes ``conversation_incomplete``;
* a conversation that ended by idle timeout or lifetime with a user message unanswered becomes
  ``conversation_stalled``.

Each alert passes the agent's rate limit, then goes to every configured sink through the one
retry layer (:func:`sidecar.retry.until_accepted`): a sink that is down is retried with capped
backoff for as long as it takes, and the effect stays pinned meanwhile (the processor then
pauses consumption: backpressure, nothing lost); a sink that *rejects* an alert is counted and
logged, and the effect goes on. The effect is accepted once every sink has taken or rejected
every alert, and only then journaled: a crash before that re-fires the hook and the alerts go out
again with the same ids.

Judging runs even with ``alerting.enabled`` off, so the uncertain-turn rate is on ``/metrics``
without any sink.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace

import structlog

from sidecar.alerting.alert import Alert, AlertKind, Detail, alert_id
from sidecar.alerting.config import AlertingConfig, PolicyConfig
from sidecar.alerting.metrics import AlertMetrics
from sidecar.alerting.policy import UncertaintyJudge
from sidecar.alerting.sinks.base import AlertSink
from sidecar.alerting.thresholds import FeedbackThresholds
from sidecar.contract import CompletionScored, Effect, GoalAssigned, Provenance, TreeScored, TurnContext
from sidecar.errors import RetryableError
from sidecar.lifecycle import Health
from sidecar.retry import until_accepted

log = structlog.get_logger(__name__)

AgentLabel = Callable[[str | None], str]
AlertObserver = Callable[[Alert, Effect], None]
_STALLED_ENDS = ("idle_ttl", "max_lifetime")


class _RateLimit:
    """Token bucket per agent: ``per_minute`` alerts, bursts up to the same number."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._buckets: dict[str, tuple[float, float]] = {}

    def allow(self, agent: str, per_minute: float) -> bool:
        if per_minute <= 0:
            return True
        now = self._clock()
        tokens, at = self._buckets.get(agent, (per_minute, now))
        tokens = min(per_minute, tokens + (now - at) * per_minute / 60.0)
        if tokens < 1.0:
            self._buckets[agent] = (tokens, now)
            return False
        self._buckets[agent] = (tokens - 1.0, now)
        return True


class Escalations:
    """An :class:`~sidecar.stage.pipeline.OutcomeSink`, a component and a health reporter."""

    name = "escalations"

    def __init__(
        self,
        config: AlertingConfig,
        sinks: Sequence[AlertSink],
        metrics: AlertMetrics,
        *,
        group: str,
        agent_label: AgentLabel,
        wall_clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        observers: Sequence[AlertObserver] = (),
        thresholds: FeedbackThresholds | None = None,
    ) -> None:
        self._cfg = config
        self.thresholds = thresholds
        """Feedback-moved thresholds (:mod:`sidecar.alerting.thresholds`), when given."""
        self._sinks = tuple(sinks) if config.enabled else ()
        self.metrics = metrics
        self._group = group
        self._label = agent_label
        self._wall = wall_clock
        self._judge = UncertaintyJudge()
        self._limits = _RateLimit(monotonic)
        self._pending = 0
        self._observers = list(observers)
        for sink in self._sinks:
            # Read at scrape time from the sink's own health (connection state included), so a sink
            # that goes down while no alert is being sent shows at once.
            metrics.sink_up.labels(sink.name).set_function(_up(sink))

    # -- lifecycle ----------------------------------------------------------------------------

    async def start(self) -> None:
        for sink in self._sinks:
            await sink.start()

    async def stop(self) -> None:
        for sink in self._sinks:
            await sink.stop()

    def health(self) -> Health:
        if not self._cfg.enabled:
            return Health("alerting", True, "disabled")
        down = [h for h in (s.health() for s in self._sinks) if not h.ready]
        if down:
            return Health("alerting", False, "; ".join(f"{h.name}: {h.detail}" for h in down))
        return Health("alerting", True, f"{len(self._sinks)} sinks, {self._pending} deliveries pending")

    # -- the stage ----------------------------------------------------------------------------

    def observe(self, observer: AlertObserver) -> None:
        """Call ``observer(alert, effect)`` for every alert decided (the tree view keeps its trees)."""
        self._observers.append(observer)

    def offer(self, effect: Effect) -> Awaitable[None] | None:
        alerts = self.decide(effect)
        if not alerts:
            return None
        for alert in alerts:
            for observer in self._observers:
                try:
                    observer(alert, effect)
                except Exception as exc:  # an observer's bug must not cost the alert
                    log.error("alert.observer_failed", error=type(exc).__name__)  # noqa: TRY400 - no traceback
        if not self._sinks:
            for a in alerts:
                self.metrics.suppressed.labels(a.kind, "no_sink").inc()
            return None
        return self._deliver_all(alerts, effect.ctx)

    def decide(self, effect: Effect) -> list[Alert]:
        """The alerts an effect calls for under the agent's policy (judging updates the window)."""
        ctx = effect.ctx
        if not effect.events and ctx.kind != "conversation_ended":
            return []  # nothing scored: only an ending can call for an alert (stalled)
        policy = self._cfg.policy_for(ctx.agent)
        label = self._label(ctx.agent)
        out: list[Alert] = []
        assigned = effect.first(GoalAssigned)
        goal = assigned.goal if isinstance(assigned, GoalAssigned) else None
        tree = effect.first(TreeScored)
        if ctx.kind == "user_message" and isinstance(tree, TreeScored):
            alert = self._uncertain(ctx, policy, label, tree)
            if alert is not None:
                out.append(alert)
        final = effect.first(CompletionScored)
        if ctx.kind == "conversation_ended":
            incomplete = isinstance(final, CompletionScored) and final.final and not final.complete
            if incomplete and policy.conversation_incomplete and isinstance(final, CompletionScored):
                out.append(self._incomplete(ctx, policy, final))
            if policy.conversation_stalled and _stalled(ctx):
                out.append(self._stalled(ctx, policy))
        return [replace(a, goal=goal) for a in out if self._allowed(a, policy)]

    def _allowed(self, alert: Alert, policy: PolicyConfig) -> bool:
        if self._limits.allow(self._label(alert.agent), policy.max_alerts_per_minute):
            return True
        self.metrics.suppressed.labels(alert.kind, "rate_limit").inc()
        return False

    # -- alert kinds ----------------------------------------------------------------------------

    def _uncertain(self, ctx: TurnContext, policy: PolicyConfig, label: str, tree: TreeScored) -> Alert | None:
        key = "\x00".join([ctx.conversation_id, str(ctx.turn)])
        rule = policy.uncertainty
        if self.thresholds is not None:
            rule = self.thresholds.uncertainty(label, rule)  # people's feedback may have moved it
        verdict = self._judge.judge(rule, label, key, tree.leaves, tree.max_logprob)
        if verdict.score is not None:
            self.metrics.uncertainty_score.labels(label).observe(verdict.score)
        if not verdict.uncertain:
            return None
        self.metrics.uncertain_turns.labels(label).inc()
        if not policy.uncertain_turn:
            return None
        details: dict[str, Detail] = {
            "leaves": tree.leaves,
            "complete_leaves": tree.complete_leaves,
            "max_logprob": tree.max_logprob,
            "mean_token_logprob": tree.mean_token_logprob,
            "uncertainty_score": verdict.score,
            "threshold": verdict.threshold,
            "rule": verdict.rule,
            "budget_hit": tree.budget_hit,
            "generated_tokens": tree.generated_tokens,
            **_who_judged(tree.provenance, rule=False),  # rule and threshold above are the alert's own
        }
        text = {"best_branch": tree.best_branch} if self._cfg.include_text and tree.best_branch else {}
        summary = f"uncertain turn {ctx.turn}: {tree.leaves} leaves, best branch logprob {_fmt(tree.max_logprob)}"
        return self._alert(ctx, "uncertain_turn", policy.severity_uncertain_turn, summary, details, text=text)

    def _incomplete(self, ctx: TurnContext, policy: PolicyConfig, final: CompletionScored) -> Alert:
        details: dict[str, Detail] = {
            "p_end": final.p_end,
            "end_reason": ctx.end_reason,
            "turns": ctx.turn,
            "model": final.model,
            **_who_judged(final.provenance, rule=True),
        }
        text = {"remaining_tasks": final.remaining_tasks} if self._cfg.include_text and final.remaining_tasks else {}
        summary = f"conversation ended incomplete after {ctx.turn} turns (P(end) {final.p_end:.2f})"
        return self._alert(
            ctx, "conversation_incomplete", policy.severity_conversation_incomplete, summary, details, text=text
        )

    def _stalled(self, ctx: TurnContext, policy: PolicyConfig) -> Alert:
        details: dict[str, Detail] = {"end_reason": ctx.end_reason, "turns": ctx.turn, "messages": len(ctx.messages)}
        summary = f"conversation stalled: the user's last message was never answered ({ctx.end_reason})"
        return self._alert(ctx, "conversation_stalled", policy.severity_conversation_stalled, summary, details)

    def _alert(
        self,
        ctx: TurnContext,
        kind: AlertKind,
        severity: str,
        summary: str,
        details: dict[str, Detail],
        *,
        text: dict[str, str] | None = None,
    ) -> Alert:
        aid = alert_id(self._group, ctx.conversation_id, ctx.turn, kind)
        base = self._cfg.tree_view_base_url
        return Alert(
            id=aid,
            kind=kind,
            severity=severity,  # type: ignore[arg-type]
            conversation_id=ctx.conversation_id,
            turn=ctx.turn,
            agent=ctx.agent or "default",
            tenant=ctx.tenant,
            goal=None,
            triggered_at_unix=ctx.triggered_at_unix,
            created_at_unix=self._wall(),
            summary=summary,
            details=details,
            text=text or {},
            tree_url=f"{base.rstrip('/')}/trees/{aid}" if base and kind == "uncertain_turn" else None,
        )

    # -- delivery -------------------------------------------------------------------------------

    async def _deliver_all(self, alerts: Sequence[Alert], ctx: TurnContext) -> None:
        jobs = [self._deliver(sink, alert, ctx) for alert in alerts for sink in self._sinks]
        self._pending += len(jobs)
        self.metrics.pending.set(self._pending)
        try:
            await asyncio.gather(*jobs)
        finally:
            self._pending -= len(jobs)
            self.metrics.pending.set(self._pending)

    async def _deliver(self, sink: AlertSink, alert: Alert, ctx: TurnContext) -> None:
        def retrying(exc: BaseException, delay: float) -> None:
            self.metrics.retries.labels(sink.name).inc()
            log.warning(
                "alert.delivery_retry",
                sink=sink.name,
                kind=alert.kind,
                error=_why(exc),
                retry_in_seconds=round(delay, 2),
            )

        retry = self._cfg.retry
        try:
            await until_accepted(
                lambda: sink.send(alert),
                retryable=lambda exc: isinstance(exc, RetryableError),
                on_retry=retrying,
                initial_seconds=retry.initial_backoff_seconds,
                cap_seconds=retry.max_backoff_seconds,
            )
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # rejected (permanent) or a sink bug: counted, the effect goes on
            self.metrics.alerts.labels(alert.kind, sink.name, "rejected").inc()
            log.error("alert.rejected", sink=sink.name, kind=alert.kind, error=_why(exc))  # noqa: TRY400 - no traceback
            return
        self.metrics.alerts.labels(alert.kind, sink.name, "delivered").inc()
        if ctx.triggered_at_unix is not None:
            self.metrics.latency.labels(alert.kind, sink.name).observe(max(0.0, self._wall() - ctx.triggered_at_unix))


def _up(sink: AlertSink) -> Callable[[], float]:
    def value() -> float:
        try:
            return 1.0 if sink.health().ready else 0.0
        except Exception:  # a sink's health must never break a scrape
            return 0.0

    return value


def _who_judged(p: Provenance | None, *, rule: bool) -> dict[str, Detail]:
    """The verdict's provenance as alert details: evaluator, its version, base model, adapter and its
    version, and with ``rule`` the verdict's rule and threshold (absent when unknown)."""
    if p is None:
        return {}
    out: dict[str, Detail] = {
        "evaluator": p.evaluator,
        "evaluator_version": p.evaluator_version,
        "base_model": p.base_model,
        "adapter": p.adapter,
        "adapter_version": p.adapter_version,
    }
    if rule:
        out.update(rule=p.rule, threshold=p.threshold)
    return out


def _stalled(ctx: TurnContext) -> bool:
    return ctx.end_reason in _STALLED_ENDS and bool(ctx.messages) and ctx.messages[-1].role == "user"


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def _why(exc: BaseException) -> str:
    reason = getattr(exc, "reason", None)
    return reason if isinstance(reason, str) else type(exc).__name__
