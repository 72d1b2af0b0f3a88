"""Verdicts as evaluation results: the one mapping every results-out sink sends.

Each typed event of an effect that is a verdict becomes one :class:`EvaluationResult`, named as
the OpenTelemetry GenAI conventions' ``gen_ai.evaluation.name`` (labels are fixed strings):

=====================  ====================  =================================================
name                   score                 label
=====================  ====================  =================================================
goal_completion        P(end), 0..1          ``complete`` / ``incomplete`` (greedy verdict)
response_uncertainty   1 - P(best branch)    ``confident`` (one leaf), ``branching`` (several),
                                             ``unscored`` (no branch reached the threshold)
user_goal              none                  the goal's stable cluster id, ``other``, ``unknown``
=====================  ====================  =================================================

A result's :attr:`~EvaluationResult.record_id` is a function of (conversation, turn, hook kind,
name) only, so an effect shown again after a restart yields the same ids: receivers that key on
them (Langfuse ``id``, Phoenix ``identifier``, OTLP ``log.record.uid``) keep one copy. The hook
kind is part of the key because a conversation's last turn gets two completion verdicts: the
turn's own (``turn_closed``) and the final one (``conversation_ended``).

Every result names its evaluator (this package) and version; ``goal_completion`` and
``response_uncertainty`` also carry the verdict's :class:`~sidecar.contract.Provenance`: the base
model, the adapter and its version, the rule and its threshold.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from sidecar.contract import CompletionScored, Effect, GoalAssigned, HookKind, Provenance, TreeScored
from sidecar.events import SpanRef
from sidecar.provenance import EVALUATOR_NAME, evaluator_version

EvaluationName = Literal["goal_completion", "response_uncertainty", "user_goal"]
EVALUATION_NAMES: tuple[EvaluationName, ...] = ("goal_completion", "response_uncertainty", "user_goal")
COMPLETION_LABELS = ("complete", "incomplete")
UNCERTAINTY_LABELS = ("confident", "branching", "unscored")
MAX_EXPLANATION_CHARS = 2048
_ELLIPSIS = "\u2026"


@dataclass(frozen=True, slots=True)
class EvaluationResult:
    """One verdict about one turn of one conversation, ready for any results-out sink."""

    record_id: str
    name: EvaluationName
    conversation_id: str
    turn: int
    hook: HookKind
    score: float | None
    label: str | None
    explanation: str | None
    span: SpanRef | None
    agent: str | None
    model: str | None
    time_unix: float | None
    final: bool = False
    provenance: Provenance | None = None
    """Who judged (base model, adapter, rule, threshold); None for ``user_goal``."""

    def provenance_metadata(self) -> dict[str, str | float]:
        """The evaluator's name and version, and the rest of the provenance that is known, as the
        flat metadata Langfuse scores and Phoenix annotations carry."""
        out: dict[str, str | float] = {"evaluator": EVALUATOR_NAME, "evaluator_version": evaluator_version()}
        if self.provenance is not None:
            out.update({k: v for k, v in self.provenance.as_dict().items() if v is not None})
        return out


def record_id(conversation_id: str, turn: int, hook: HookKind, name: str) -> str:
    """32 hex digits, stable across processes and restarts (SHA-256 of the key, NUL-separated)."""
    key = "\x00".join([conversation_id, str(turn), hook, name])
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def _text(value: str) -> str:
    if len(value) > MAX_EXPLANATION_CHARS:
        value = value[: MAX_EXPLANATION_CHARS - 1] + _ELLIPSIS
    return value.encode("utf-8", "replace").decode("utf-8")


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def evaluation_results(effect: Effect, *, include_text: bool = False) -> list[EvaluationResult]:
    """The results an effect carries, in event order; none for skipped or failed scorers."""
    ctx = effect.ctx
    out: list[EvaluationResult] = []

    def add(
        name: EvaluationName,
        score: float | None,
        label: str | None,
        explanation: str | None,
        model: str | None,
        *,
        final: bool = False,
        provenance: Provenance | None = None,
    ) -> None:
        out.append(
            EvaluationResult(
                record_id=record_id(ctx.conversation_id, ctx.turn, ctx.kind, name),
                name=name,
                conversation_id=ctx.conversation_id,
                turn=ctx.turn,
                hook=ctx.kind,
                score=_finite(score),
                label=label,
                explanation=_text(explanation) if explanation else None,
                span=ctx.span,
                agent=ctx.agent,
                model=model,
                time_unix=ctx.triggered_at_unix,
                final=final,
                provenance=provenance,
            )
        )

    seen: set[EvaluationName] = set()
    for event in effect.events:
        if isinstance(event, CompletionScored) and "goal_completion" not in seen:
            seen.add("goal_completion")
            label = "complete" if event.complete else "incomplete"
            which = "final verdict" if event.final else f"turn {ctx.turn}"
            explanation = f"{which}: P(end) {event.p_end:.3f}, {label}"
            if include_text and event.remaining_tasks and not event.complete:
                explanation += f"; remaining: {event.remaining_tasks}"
            add(
                "goal_completion",
                event.p_end,
                label,
                explanation,
                event.model,
                final=event.final,
                provenance=event.provenance,
            )
        elif isinstance(event, TreeScored) and "response_uncertainty" not in seen:
            seen.add("response_uncertainty")
            add("response_uncertainty", *_uncertainty(event), event.model, provenance=event.provenance)
        elif isinstance(event, GoalAssigned) and "user_goal" not in seen:
            seen.add("user_goal")
            add("user_goal", None, event.goal, None, None)
    return out


def _uncertainty(tree: TreeScored) -> tuple[float | None, str, str]:
    if tree.max_logprob is None or tree.leaves == 0:
        return None, "unscored", f"no branch above the threshold ({tree.budget_hit or 'no budget hit'})"
    score = 1.0 - math.exp(min(0.0, tree.max_logprob))
    label = "confident" if tree.leaves == 1 else "branching"
    explanation = f"{tree.leaves} leaves ({tree.complete_leaves} complete), best branch logprob {tree.max_logprob:.3f}"
    if tree.budget_hit:
        explanation += f", budget hit: {tree.budget_hit}"
    return score, label, explanation


def results_of(effects: Sequence[Effect], *, include_text: bool = False) -> list[EvaluationResult]:
    """Every result of several effects (tests and tools)."""
    return [r for e in effects for r in evaluation_results(e, include_text=include_text)]
