"""Label-free self-calibration: a P(end) threshold per agent from its own held-back conversations.

The truncation protocol (paper Section 5.3) needs no labels: each held-back conversation, whole,
is a "complete" example, and the same conversation cut after a uniformly drawn earlier turn is an
"incomplete" one. On those examples two rules are compared:

- **greedy** (the paper's): complete iff the end tag is the most likely next token;
- **threshold**: complete iff P(end) >= t, with t chosen on the same examples to maximise an
  objective (balanced accuracy by default, or F1 with "complete" positive).

A threshold chosen and scored on the same examples flatters itself, so its figure is also
estimated by cross-validation over conversations (a conversation's two copies stay in one fold):
each fold is scored with the threshold chosen on the others. The rule recommended, and the F1
recorded as the adapter's validation, compare the greedy rule with that cross-validated figure.

Candidate thresholds lie between consecutive distinct P(end) values, midway in log space (P(end)
spans many orders of magnitude); among equally good ones the middle of the best run is taken.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from adapters.data.conversations import stable_unit
from adapters.evaluation.metrics import binary_metrics
from sidecar.tools.classification import precision_recall_f1

Objective = Literal["balanced_accuracy", "f1"]
OBJECTIVES: tuple[Objective, ...] = ("balanced_accuracy", "f1")
# The threshold rule must beat the greedy one by this much (cross-validated F1) to be recommended:
# on a few dozen examples smaller differences are noise.
PREFERENCE_MARGIN = 0.01
_FLOOR = 1e-45


@dataclass(frozen=True, slots=True)
class ScoredExample:
    """One protocol example as the adapter scored it."""

    conversation_id: str
    complete: bool  # the protocol's label: whole conversation or truncated copy
    p_end: float
    greedy_end: bool  # the end tag was the argmax


def _log(p: float) -> float:
    return math.log(max(p, _FLOOR))


def objective_value(labels: Sequence[bool], predicted: Sequence[bool], objective: Objective) -> float:
    tp = sum(1 for y, p in zip(labels, predicted, strict=True) if y and p)
    tn = sum(1 for y, p in zip(labels, predicted, strict=True) if not y and not p)
    pos = sum(labels)
    neg = len(labels) - pos
    if objective == "f1":
        fp = sum(1 for y, p in zip(labels, predicted, strict=True) if not y and p)
        return precision_recall_f1(tp, fp, pos - tp)[2] or 0.0
    return ((tp / pos if pos else 0.0) + (tn / neg if neg else 0.0)) / 2


def candidate_thresholds(p_end: Sequence[float]) -> list[float]:
    """Thresholds separating every pair of consecutive distinct values, plus one below and above all."""
    logs = sorted({_log(p) for p in p_end})
    if not logs:
        return []
    cuts = [logs[0] - 1.0, *((a + b) / 2 for a, b in itertools.pairwise(logs)), logs[-1] + 1.0]
    return [math.exp(c) for c in cuts]


def choose_threshold(
    labels: Sequence[bool], p_end: Sequence[float], objective: Objective = "balanced_accuracy"
) -> float | None:
    """The threshold maximising ``objective`` (None when one class is missing)."""
    if all(labels) or not any(labels):
        return None
    cands = candidate_thresholds(p_end)
    values = [objective_value(labels, [p >= t for p in p_end], objective) for t in cands]
    best = max(values)
    best_idx = [i for i, v in enumerate(values) if v >= best - 1e-12]
    # The longest run of consecutive best candidates, then its middle: the most margin both ways.
    runs: list[list[int]] = []
    for i in best_idx:
        if runs and runs[-1][-1] == i - 1:
            runs[-1].append(i)
        else:
            runs.append([i])
    run = max(runs, key=len)
    return cands[run[len(run) // 2]]


def _folds(examples: Sequence[ScoredExample], k: int) -> list[list[int]]:
    ids = sorted({e.conversation_id for e in examples}, key=lambda c: stable_unit(c, "calibration-fold"))
    fold_of = {cid: i % k for i, cid in enumerate(ids)}
    out: list[list[int]] = [[] for _ in range(k)]
    for i, e in enumerate(examples):
        out[fold_of[e.conversation_id]].append(i)
    return [f for f in out if f]


def cross_validated_predictions(
    examples: Sequence[ScoredExample], folds: int, objective: Objective
) -> list[bool] | None:
    """Each example judged by the threshold chosen on the other folds (None if a fold cannot choose)."""
    predicted: list[bool | None] = [None] * len(examples)
    parts = _folds(examples, folds)
    if len(parts) < 2:
        return None
    for part in parts:
        held = set(part)
        rest = [e for i, e in enumerate(examples) if i not in held]
        t = choose_threshold([e.complete for e in rest], [e.p_end for e in rest], objective)
        if t is None:
            return None
        for i in part:
            predicted[i] = examples[i].p_end >= t
    return [bool(p) for p in predicted]


def calibrate(
    examples: Sequence[ScoredExample], *, objective: Objective = "balanced_accuracy", folds: int = 5
) -> dict[str, Any]:
    """Both rules on the protocol examples, the chosen threshold and the recommended rule."""
    labels = [e.complete for e in examples]
    p_end = [e.p_end for e in examples]
    greedy = binary_metrics(labels, [e.greedy_end for e in examples], p_end)
    threshold = choose_threshold(labels, p_end, objective)
    out: dict[str, Any] = {
        "objective": objective,
        "examples": len(examples),
        "conversations": len({e.conversation_id for e in examples}),
        "greedy": greedy,
        "p_end_threshold": threshold,
        "threshold_in_sample": None,
        "threshold_cross_validated": None,
    }
    cv_f1: float | None = None
    if threshold is not None:
        out["threshold_in_sample"] = binary_metrics(labels, [p >= threshold for p in p_end], p_end)
        cv = cross_validated_predictions(examples, folds, objective)
        if cv is not None:
            out["threshold_cross_validated"] = binary_metrics(labels, cv, p_end)
            cv_f1 = out["threshold_cross_validated"]["complete"]["f1"]
    greedy_f1 = greedy["complete"]["f1"]
    use_threshold = cv_f1 is not None and cv_f1 > greedy_f1 + PREFERENCE_MARGIN
    out["recommended_rule"] = "threshold" if use_threshold else "greedy"
    out["validation_f1"] = cv_f1 if use_threshold else greedy_f1
    return out
