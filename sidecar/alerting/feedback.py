"""People's feedback on alerts and conversations: counted per agent and kind, live alert precision.

The :class:`~sidecar.stage.feedback.FeedbackSink` of ``sidecar run``. An alert is named by its
``alert_id`` and ``turn`` (both in its payload): :meth:`AlertFeedback.resolve_alert` recomputes the
ids this consumer group gives that conversation's alerts at that turn
(:func:`~sidecar.alerting.alert.alert_id`), so an id is recognised without remembering any alert,
the same way before and after a restart, and a forged or mistyped one is dead-lettered
(``unknown_alert``).

Metrics (label sets closed: ``agent`` is bounded by :class:`~sidecar.telemetry.labels.AgentLabels`):

* ``sidecar_feedback_total{agent,target,rating}``: every feedback applied;
* ``sidecar_alert_feedback_total{agent,kind,verdict}``: true and false alarms per alert kind, the
  counts behind the precision;
* ``sidecar_alert_precision{agent,kind}``: true alarms / judged alarms since this process started
  (a series appears with the first judged alarm). Over a window, compute it from the counter, as
  the dashboard does.

With ``alerting.feedback.adapt_thresholds`` the judgements also move thresholds
(:mod:`sidecar.alerting.thresholds`): through the fleet's ledger when there is one
(:mod:`sidecar.alerting.ledger`: every replica counts the same rows, a restart counts them again),
else in this process.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import structlog
from prometheus_client import CollectorRegistry, Counter, Gauge

from sidecar.alerting.alert import ALERT_KINDS, alert_id
from sidecar.alerting.config import AlertingConfig
from sidecar.alerting.ledger import FeedbackLedger
from sidecar.alerting.thresholds import MOVING_KINDS, FeedbackThresholds
from sidecar.contract import Outcome
from sidecar.stage.feedback import FeedbackContext, feedback_outcome

log = structlog.get_logger(__name__)

AgentLabel = Callable[[str | None], str]


class FeedbackMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.feedback = Counter(
            "sidecar_feedback_total",
            "People's feedback applied, by agent, target (conversation, turn, alert) and rating "
            "(up, down, true_alarm, false_alarm).",
            ["agent", "target", "rating"],
            registry=registry,
        )
        self.alert_feedback = Counter(
            "sidecar_alert_feedback_total",
            "Alerts judged by people, by agent, alert kind and verdict (true_alarm, false_alarm).",
            ["agent", "kind", "verdict"],
            registry=registry,
        )
        self.precision = Gauge(
            "sidecar_alert_precision",
            "True alarms / alarms judged by people since the process started, by agent and alert kind "
            "(the counts: sidecar_alert_feedback_total).",
            ["agent", "kind"],
            registry=registry,
        )


class AlertFeedback:
    """Counts feedback and keeps live alert precision (see the module docstring)."""

    name = "feedback"

    def __init__(
        self,
        group: str,
        metrics: FeedbackMetrics,
        agent_label: AgentLabel,
        *,
        thresholds: FeedbackThresholds | None = None,
        alerting: AlertingConfig | None = None,
        ledger: FeedbackLedger | None = None,
    ) -> None:
        self._group = group
        self.metrics = metrics
        self._label = agent_label
        self.thresholds = thresholds
        self._alerting = alerting
        self.ledger = ledger
        # (agent label, kind) -> [true alarms, false alarms] since this process started.
        self._judged: dict[tuple[str, str], list[int]] = {}

    def resolve_alert(self, conversation_id: str, turn: int, alert: str) -> str | None:
        for kind in ALERT_KINDS:
            if alert_id(self._group, conversation_id, turn, kind) == alert:
                return kind
        return None

    def apply(self, ctx: FeedbackContext) -> Outcome:
        fb = ctx.target.feedback
        label = self._label(ctx.target.agent)
        self.metrics.feedback.labels(label, fb.target, fb.rating).inc()
        if ctx.alert_kind is not None:
            self.metrics.alert_feedback.labels(label, ctx.alert_kind, fb.rating).inc()
            counts = self._judged.setdefault((label, ctx.alert_kind), [0, 0])
            counts[0 if fb.rating == "true_alarm" else 1] += 1
            self.metrics.precision.labels(label, ctx.alert_kind).set(counts[0] / (counts[0] + counts[1]))
            if self.thresholds is not None and self.ledger is None:  # with a ledger: counted from its rows
                policy = self._alerting.policy_for(ctx.target.agent) if self._alerting is not None else None
                self.thresholds.judged(
                    label,
                    ctx.alert_kind,
                    true_alarm=fb.rating == "true_alarm",
                    configured_rate=policy.uncertainty.target_rate if policy is not None else None,
                )
        log.info(
            "feedback.applied",
            agent=label,
            target=fb.target,
            rating=fb.rating,
            kind=ctx.alert_kind,
            turn=fb.turn,
            conversation_open=ctx.target.open,
        )
        return feedback_outcome(ctx)

    def recorded(self, ctx: FeedbackContext, *, again: bool) -> asyncio.Future[None] | None:
        """A judged alert of a kind that moves, written to the ledger (when there is one)."""
        fb = ctx.target.feedback
        if self.ledger is None or ctx.alert_kind not in MOVING_KINDS or fb.rating not in ("true_alarm", "false_alarm"):
            return None
        return self.ledger.record(
            ctx.event_id, ctx.target.agent, ctx.alert_kind, true_alarm=fb.rating == "true_alarm", again=again
        )

    def judged(self, agent: str, kind: str) -> tuple[int, int]:
        """(true alarms, false alarms) judged for ``agent``'s (label's) ``kind`` since the start."""
        true, false = self._judged.get((agent, kind), [0, 0])
        return true, false
