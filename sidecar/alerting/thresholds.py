"""Thresholds that move with people's feedback, within configured bounds (off by default).

What moves: the uncertain-turn rule's ``target_rate`` (relative mode), the share of an agent's
response trees flagged as uncertain. It is the configured rate times a *scale* per agent, between
``alerting.feedback.min_rate_scale`` and 1: feedback can make the rule stricter, and let it relax
back, never flag more than configured. Every ``min_judged_alerts`` judgements of an agent's
uncertain-turn alerts (true or false alarm, :mod:`sidecar.alerting.feedback`) close a batch:

* precision of the batch below ``target_precision``: the scale shrinks by ``step`` (fewer alerts);
* at or above it: the scale grows back by the same factor, up to 1;
* at a bound it stays, and nothing is logged.

Each move is logged (``alerting.threshold_moved``: agent, kind, rate and scale before and after,
the batch's precision and size), counted (``sidecar_alert_threshold_moves_total``), shown as
``sidecar_alert_threshold_scale`` and on ``/readyz`` (``alert_thresholds``), and reversible:
``adapt_thresholds: false`` puts every configured threshold back, as does a restart, since
the scale lives in the process like the uncertainty window it applies to.

Deterministic: the scale is a function of the sequence of feedback the process applied, and
applied feedback is journaled, so a replay after a restart applies none of it twice.
"""

from __future__ import annotations

import structlog
from prometheus_client import CollectorRegistry, Counter, Gauge

from sidecar.alerting.config import FeedbackThresholdsConfig, UncertaintyPolicyConfig
from sidecar.lifecycle import Health

log = structlog.get_logger(__name__)

MOVING_KINDS = ("uncertain_turn",)
_DETAIL_AGENTS = 20


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
    """The per-agent scales and their batches (see the module docstring); a health reporter."""

    name = "alert_thresholds"

    def __init__(self, cfg: FeedbackThresholdsConfig, metrics: ThresholdMetrics) -> None:
        self._cfg = cfg
        self.metrics = metrics
        self._scale: dict[tuple[str, str], float] = {}
        self._batch: dict[tuple[str, str], list[int]] = {}  # [true alarms, judged]
        self._configs: dict[tuple[UncertaintyPolicyConfig, float], UncertaintyPolicyConfig] = {}

    def scale(self, agent: str, kind: str) -> float:
        return self._scale.get((agent, kind), 1.0) if self._cfg.adapt_thresholds else 1.0

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
        """One alert of ``agent`` (its metric label) judged; may close a batch and move its threshold."""
        cfg = self._cfg
        if not cfg.adapt_thresholds or kind not in MOVING_KINDS:
            return
        key = (agent, kind)
        batch = self._batch.setdefault(key, [0, 0])
        batch[0] += int(true_alarm)
        batch[1] += 1
        if batch[1] < cfg.min_judged_alerts:
            return
        true, judged = batch
        self._batch[key] = [0, 0]
        precision = true / judged
        before = self._scale.get(key, 1.0)
        if precision < cfg.target_precision:
            after, direction = max(cfg.min_rate_scale, before * (1.0 - cfg.step)), "stricter"
        else:
            after, direction = min(1.0, before / (1.0 - cfg.step)), "relaxed"
        if after == before:
            return
        self._scale[key] = after
        self.metrics.scale.labels(agent, kind).set(after)
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
            batch_precision=round(precision, 4),
            batch_judged=judged,
        )

    def health(self) -> Health:
        if not self._cfg.adapt_thresholds:
            return Health(self.name, True, "off: configured thresholds")
        moved = sorted((k, s) for k, s in self._scale.items() if s != 1.0)
        if not moved:
            return Health(self.name, True, "as configured (no feedback move yet)")
        parts = [f"{agent} {kind}: target rate x{s:.3f}" for (agent, kind), s in moved[:_DETAIL_AGENTS]]
        more = f" and {len(moved) - _DETAIL_AGENTS} more" if len(moved) > _DETAIL_AGENTS else ""
        # Never gates readiness: a moved threshold is a fact to show.
        return Health(self.name, True, "moved by feedback: " + "; ".join(parts) + more)
