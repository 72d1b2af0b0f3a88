"""Binary completion metrics (both classes), ROC-AUC and confusion matrix."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sidecar.tools.classification import precision_recall_f1


def _scores(tp: int, fp: int, fn: int) -> dict[str, float]:
    """Precision, recall and F1 rounded for the report, 0.0 where undefined."""
    p, r, f = precision_recall_f1(tp, fp, fn)
    return {"precision": round(p or 0.0, 4), "recall": round(r or 0.0, 4), "f1": round(f or 0.0, 4)}


def roc_auc(labels: Sequence[bool], scores: Sequence[float]) -> float | None:
    """Mann-Whitney AUC (ties count half); None when one class is absent."""
    pos = [s for s, y in zip(scores, labels, strict=True) if y]
    neg = [s for s, y in zip(scores, labels, strict=True) if not y]
    if not pos or not neg:
        return None
    ranked = sorted([(s, 1) for s in pos] + [(s, 0) for s in neg])
    rank_sum = 0.0
    i = 0
    while i < len(ranked):
        j = i
        while j < len(ranked) and ranked[j][0] == ranked[i][0]:
            j += 1
        avg = (i + j + 1) / 2  # 1-based average rank of the tie group
        rank_sum += avg * sum(1 for k in range(i, j) if ranked[k][1])
        i = j
    return round((rank_sum - len(pos) * (len(pos) + 1) / 2) / (len(pos) * len(neg)), 4)


def binary_metrics(
    labels: Sequence[bool], predicted: Sequence[bool], scores: Sequence[float] | None = None
) -> dict[str, Any]:
    """Metrics with "complete" (True) as the positive class, and the same for "incomplete"."""
    if len(labels) != len(predicted):
        raise ValueError("labels and predictions differ in length")
    tp = sum(1 for y, p in zip(labels, predicted, strict=True) if y and p)
    tn = sum(1 for y, p in zip(labels, predicted, strict=True) if not y and not p)
    fp = sum(1 for y, p in zip(labels, predicted, strict=True) if not y and p)
    fn = sum(1 for y, p in zip(labels, predicted, strict=True) if y and not p)
    n = len(labels)
    return {
        "n": n,
        "n_complete": tp + fn,
        "accuracy": round((tp + tn) / n, 4) if n else 0.0,
        "complete": _scores(tp, fp, fn),
        "incomplete": _scores(tn, fn, fp),
        "roc_auc": roc_auc(labels, scores) if scores is not None else None,
        "confusion": {
            "true_complete_pred_complete": tp,
            "true_complete_pred_incomplete": fn,
            "true_incomplete_pred_complete": fp,
            "true_incomplete_pred_incomplete": tn,
        },
    }


def flat_metrics(labels: list[bool], predicted: list[bool], p_end: list[float]) -> dict[str, Any]:
    """The figures the curve and leave-one-out reports tabulate, one level deep ("complete" positive)."""
    m = binary_metrics(labels, predicted, p_end)
    return {
        "f1_complete": m["complete"]["f1"],
        "f1_incomplete": m["incomplete"]["f1"],
        "accuracy": m["accuracy"],
        "roc_auc": m["roc_auc"],
        "precision_complete": m["complete"]["precision"],
        "recall_complete": m["complete"]["recall"],
        "n": m["n"],
    }
