"""Thresholds that move with people's feedback, within configured bounds (off by default).

What moves: the uncertain-turn rule's ``target_rate`` (relative mode), the share of an agent's
response trees flagged as uncertain. It is the configured rate times a *scale* per agent, between
``alerting.feedback.min_rate_scale`` and 1: feedback can make the rule stricter, and let it relax
back, never flag more than configured.

The scale is a **function of the tally** of an agent's judged uncertain-turn alerts (true and
false alarms, :mod:`sidecar.alerting.feedback`) since the feedback ``epoch``, never of their
order (:func:`scale_for`). Below ``min_judged_alerts`` judgements nothing moves. From there, the
true alarms missing for ``target_precision`` (``target_precision x judged - true``) make the rule
stricter by one ``step`` for every ``target_precision x min_judged_alerts`` of them or part
thereof: a precision below target moves it at least one step, further true alarms move it back,
and at or above the target it is as configured. Because a sum does not depend on order, every
replica holding the same judgements holds the same thresholds, and a restart that counts them
again (:mod:`sidecar.alerting.ledger`: the judgements are rows of a compacted topic, one per
feedback event id) gets them back.

Each move is logged (``alerting.threshold_moved``: agent, kind, rate and scale before and after,
the tally behind it), counted (``sidecar_alert_threshold_moves_total``), shown as
``sidecar_alert_threshold_scale`` and on ``/readyz`` (``alert_thresholds``), and reversible:
``adapt_thresholds: false`` puts every configured threshold back, and raising
``alerting.feedback.epoch`` starts every tally again from nothing.
"""

from __future__ import annotations

import math

import structlog
from prometheus_client import CollectorRegistry, Counter, Gauge

from sidecar.alerting.config import FeedbackThresholdsConfig, UncertaintyPolicyConfig
from sidecar.lifecycle import Health

log = structlog.get_logger(__name__)

MOVING_KINDS = ("uncertain_turn",)
_DETAIL_AGENTS = 20


def scale_for(true: int, false: int, cfg: FeedbackThresholdsConfig) -> float:
    """The share of the configured target rate in force after ``true`` true and ``false`` false
    alarms (see the module docstring); 1.0 when nothing moves."""
    judged = true + false
    if judged < cfg.min_judged_alerts:
        return 1.0
    # Integers scaled by the judged count keep the step count exact (no float edge at a boundary).
    shortfall = cfg.target_precision * judged - true
    if shortfall <= 1e-9:
        return 1.0
    steps = math.ceil(shortfall / (cfg.target_precision * cfg.min_judged_alerts) - 1e-9)
    return max(cfg.min_rate_scale, (1.0 - cfg.step) ** steps)


class ThresholdMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.scale = Gauge(
            "sidecar_alert_threshold_scale",
            "Share of the configured uncertain-turn target rate in force after feedback moves, by agent and kind "
            "(1: as configured).",
            ["agent", "kind"],
            registry=registry,
        )
        self.moves = Counter(
            "sidecar_alert_threshold_moves_total",
            "Threshold moves made by people's feedback, by agent, kind and direction (stricter, relaxed).",
            ["agent", "kind", "direction"],
            registry=registry,
        )


class FeedbackThresholds:
    """The per-agent tallies and the scales they give (see the module docstring); a health reporter.

    Tallies change through :meth:`judged` (one judgement, counted in this process: a stage without
    a ledger) or :meth:`count` (a ledger's row added or removed)."""

    name = "alert_thresholds"

    def __init__(self, cfg: FeedbackThresholdsConfig, metrics: ThresholdMetrics) -> None:
        self._cfg = cfg
        self.metrics = metrics
        self._scale: dict[tuple[str, str], float] = {}
        self._tally: dict[tuple[str, str], list[int]] = {}  # [true alarms, false alarms]
        self._configs: dict[tuple[UncertaintyPolicyConfig, float], UncertaintyPolicyConfig] = {}
        self.waiting_for: str | None = None
        """Set by a ledger while it has not read its topic yet (``/readyz`` says so)."""

    def scale(self, agent: str, kind: str) -> float:
        return self._scale.get((agent, kind), 1.0) if self._cfg.adapt_thresholds else 1.0

    def tally(self, agent: str, kind: str) -> tuple[int, int]:
        """(true alarms, false alarms) counted for ``agent``'s ``kind``."""
        true, false = self._tally.get((agent, kind), [0, 0])
        return true, false

    def uncertainty(self, agent: str, configured: UncertaintyPolicyConfig) -> UncertaintyPolicyConfig:
        """``configured`` with the agent's target rate in force (the same object when unmoved)."""
        s = self.scale(agent, "uncertain_turn")
        if s == 1.0 or configured.mode != "relative":
            return configured
        key = (configured, s)
        moved = self._configs.get(key)
        if moved is None:
            if len(self._configs) > 4096:  # a few agents x a few scales; bounded all the same
                self._configs.clear()
            moved = self._configs[key] = configured.model_copy(update={"target_rate": configured.target_rate * s})
        return moved

    def judged(self, agent: str, kind: str, *, true_alarm: bool, configured_rate: float | None = None) -> None:
        """One alert of ``agent`` (its metric label) judged in this process; may move its threshold."""
        self.count(agent, kind, true_alarm=true_alarm, delta=1, configured_rate=configured_rate)

    def count(
        self,
        agent: str,
        kind: str,
        *,
        true_alarm: bool,
        delta: int,
        configured_rate: float | None = None,
        announce: bool = True,
    ) -> None:
        """Add ``delta`` (+1 or -1) judgements to a tally and apply the scale it gives; a move is
        logged and counted unless ``announce`` is false (a ledger reading back what it holds:
        :meth:`restored` then logs where each threshold stands)."""
        cfg = self._cfg
        if not cfg.adapt_thresholds or kind not in MOVING_KINDS:
            return
        key = (agent, kind)
        tally = self._tally.setdefault(key, [0, 0])
        tally[0 if true_alarm else 1] = max(0, tally[0 if true_alarm else 1] + delta)
        before = self._scale.get(key, 1.0)
        after = scale_for(tally[0], tally[1], cfg)
        if after == before:
            return
        self._scale[key] = after
        direction = "stricter" if after < before else "relaxed"
        self.metrics.scale.labels(agent, kind).set(after)
        if not announce:
            return
        self.metrics.moves.labels(agent, kind, direction).inc()
        log.info(
            "alerting.threshold_moved",
            agent=agent,
            kind=kind,
            direction=direction,
            scale_before=round(before, 6),
            scale_after=round(after, 6),
            target_rate_before=None if configured_rate is None else round(configured_rate * before, 6),
            target_rate_after=None if configured_rate is None else round(configured_rate * after, 6),
            true_alarms=tally[0],
            false_alarms=tally[1],
            epoch=cfg.epoch,
        )

    def restored(self) -> None:
        """Log each threshold a ledger's rows moved while it read them back (one line per agent and kind)."""
        for (agent, kind), s in sorted(self._scale.items()):
            if s != 1.0:
                true, false = self._tally[(agent, kind)]
                log.info(
                    "alerting.threshold_restored",
                    agent=agent,
                    kind=kind,
                    scale=round(s, 6),
                    true_alarms=true,
                    false_alarms=false,
                    epoch=self._cfg.epoch,
                )

    def health(self) -> Health:
        if not self._cfg.adapt_thresholds:
            return Health(self.name, True, "off: configured thresholds")
        if self.waiting_for is not None:
            # Until the judgements are read back, this replica's thresholds may differ from the
            # fleet's: not ready, as for the routing table.
            return Health(self.name, False, f"reading the judgements: {self.waiting_for}")
        moved = sorted((k, s) for k, s in self._scale.items() if s != 1.0)
        epoch = f"epoch {self._cfg.epoch}: "
        if not moved:
            return Health(self.name, True, epoch + "as configured (no feedback move yet)")
        parts = [
            f"{agent} {kind}: target rate x{s:.3f} ({self._tally[(agent, kind)][0]} true, "
            f"{self._tally[(agent, kind)][1]} false)"
            for (agent, kind), s in moved[:_DETAIL_AGENTS]
        ]
        more = f" and {len(moved) - _DETAIL_AGENTS} more" if len(moved) > _DETAIL_AGENTS else ""
        return Health(self.name, True, epoch + "moved by feedback: " + "; ".join(parts) + more)
