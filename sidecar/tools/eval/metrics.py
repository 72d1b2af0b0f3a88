"""The report's numbers, computed from ``results.jsonl`` rows alone (so a resumed run, or anyone
holding the file, gets the same figures): Table-2-style completion metrics, ROC, Table-3
correlations and the top-10%-on-both selection of Appendix C.2.2."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from sklearn.metrics import roc_auc_score, roc_curve

from sidecar.tools.judge.report import MethodRow, classification_row


@dataclass(frozen=True, slots=True)
class Example:
    """One completion verdict under the truncation protocol (label True: the full conversation)."""

    id: str
    source: str
    label: bool
    p_end: float
    predicted: bool


def completion_examples(rows: Iterable[Mapping[str, Any]]) -> tuple[list[Example], int]:
    """Full copies (label complete) and truncated copies (label incomplete); and how many failed."""
    out: list[Example] = []
    errors = 0
    for row in rows:
        comp = row.get("completion") or {}
        for key, label in (("full", True), ("truncated", False)):
            v = comp.get(key)
            if v is None:
                continue
            if "p_end" not in v or v.get("p_end") is None:
                errors += 1
                continue
            out.append(Example(row["id"], row.get("source", "unknown"), label, float(v["p_end"]), bool(v["complete"])))
    return out, errors


def _auc(labels: Sequence[bool], scores: Sequence[float]) -> float | None:
    return float(roc_auc_score(labels, scores)) if len(set(labels)) == 2 else None


def classification(examples: Sequence[Example], method: str = "sidecar completion (judge-free)") -> dict[str, Any]:
    """Accuracy, and precision / recall / F1 with each class as the positive one, plus ROC-AUC."""
    labels = [e.label for e in examples]
    preds = [e.predicted for e in examples]
    pos = classification_row(method, labels, preds)
    neg = classification_row(method, [not y for y in labels], [not p for p in preds])
    tp = sum(1 for y, p in zip(labels, preds, strict=True) if y and p)
    tn = sum(1 for y, p in zip(labels, preds, strict=True) if not y and not p)
    return {
        "n": len(examples),
        "complete": sum(labels),
        "incomplete": len(labels) - sum(labels),
        "accuracy": pos.accuracy,
        "positive_complete": {"precision": pos.precision, "recall": pos.recall, "f1": pos.f1},
        "positive_incomplete": {"precision": neg.precision, "recall": neg.recall, "f1": neg.f1},
        "confusion": {"tp": tp, "fp": sum(preds) - tp, "fn": sum(labels) - tp, "tn": tn},
        "roc_auc": _auc(labels, [e.p_end for e in examples]),
    }


def completion_section(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Overall and per-source protocol metrics, and real labels where the dataset has them."""
    examples, errors = completion_examples(rows)
    by_source: dict[str, list[Example]] = {}
    for e in examples:
        by_source.setdefault(e.source, []).append(e)
    real = []
    for row in rows:
        completed = (row.get("labels") or {}).get("completed")
        full = (row.get("completion") or {}).get("full") or {}
        if isinstance(completed, bool) and full.get("p_end") is not None:
            real.append(
                Example(
                    row["id"], row.get("source", "unknown"), completed, float(full["p_end"]), bool(full["complete"])
                )
            )
    return {
        "positive_class": "complete (the full conversation); the truncated copy is the negative class",
        "errors": errors,
        "overall": classification(examples) if examples else None,
        "by_source": {s: classification(ex) for s, ex in sorted(by_source.items())},
        "real_labels": classification(real) if len({e.label for e in real}) == 2 else None,
    }


def judge_rows(rows: Iterable[Mapping[str, Any]]) -> list[MethodRow]:
    """The sidecar's row and the LLM judge's on the examples both scored (empty without a judge),
    the judge's with its cost per conversation (:mod:`sidecar.tools.judge.report`)."""
    labels: list[bool] = []
    ours: list[bool] = []
    theirs: list[bool] = []
    undecided = calls = prompt = generated = 0
    for row in rows:
        judge = row.get("judge") or {}
        comp = row.get("completion") or {}
        for key, label in (("full", True), ("truncated", False)):
            v, j = comp.get(key), judge.get(key)
            if not v or not j or v.get("p_end") is None:
                continue
            labels.append(label)
            ours.append(bool(v["complete"]))
            theirs.append(bool(j["complete"]))
            undecided += 0 if j["decided"] else 1
            calls += j["calls"]
            prompt += j["prompt_tokens"]
            generated += j["completion_tokens"]
    if not labels:
        return []
    return [
        classification_row("sidecar completion (judge-free)", labels, ours),
        classification_row(
            "two-dimensional LLM judge",
            labels,
            theirs,
            judge_free=False,
            undecided=undecided,
            calls=calls,
            prompt_tokens=prompt,
            completion_tokens=generated,
        ),
    ]


def roc_points(examples: Sequence[Example]) -> tuple[list[float], list[float]] | None:
    labels = [e.label for e in examples]
    if len(set(labels)) < 2:
        return None
    fpr, tpr, _ = roc_curve(labels, [e.p_end for e in examples])
    return [float(x) for x in fpr], [float(y) for y in tpr]


def tree_samples(rows: Iterable[Mapping[str, Any]]) -> tuple[list[dict[str, Any]], int]:
    """Every scored tree with its conversation's id, source and final verdict; and failures."""
    out: list[dict[str, Any]] = []
    errors = 0
    for row in rows:
        full = (row.get("completion") or {}).get("full") or {}
        for tree in row.get("trees") or []:
            if tree.get("error") or tree.get("max_logprob") is None:
                errors += 1
                continue
            out.append(
                {
                    **tree,
                    "id": row["id"],
                    "source": row.get("source", "unknown"),
                    "verdict_complete": full.get("complete"),
                }
            )
    return out, errors


def _ranks(x: np.ndarray[Any, np.dtype[np.float64]]) -> np.ndarray[Any, np.dtype[np.float64]]:
    order = np.argsort(x, kind="mergesort")
    ranks = np.empty(len(x), dtype=np.float64)
    ranks[order] = np.arange(len(x), dtype=np.float64)
    for value in np.unique(x):  # ties share their mean rank
        tied = x == value
        ranks[tied] = ranks[tied].mean()
    return ranks


def correlation(a: Sequence[float], b: Sequence[float]) -> dict[str, float | int | None]:
    """Pearson and Spearman r, None when either side is constant or there are fewer than 3 pairs."""
    x, y = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if len(x) < 3 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return {"n": len(x), "pearson": None, "spearman": None}
    pearson = float(np.corrcoef(x, y)[0, 1])
    spearman = float(np.corrcoef(_ranks(x), _ranks(y))[0, 1])
    return {"n": len(x), "pearson": pearson, "spearman": spearman}


PAIRS = (
    ("max logprob vs length", "max_logprob", "length_chars"),
    ("leaves vs length", "leaves", "length_chars"),
    ("max logprob vs leaves", "max_logprob", "leaves"),
)


def correlations(trees: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, dict[str, float | int | None]]]:
    """Table 3: per group (``all`` and each source), each pair's correlations."""
    groups: dict[str, list[Mapping[str, Any]]] = {"all": list(trees)}
    for t in trees:
        groups.setdefault(str(t["source"]), []).append(t)
    return {
        g: {name: correlation([t[a] for t in ts], [t[b] for t in ts]) for name, a, b in PAIRS}
        for g, ts in groups.items()
    }


def top_on_both(trees: Sequence[Mapping[str, Any]], percentile: float = 90.0) -> dict[str, Any]:
    """Trees at or above the ``percentile`` in leaves AND in negative max logprob (App. C.2.2),
    most leaves first, then lowest max logprob."""
    if not trees:
        return {"leaves_threshold": None, "max_logprob_threshold": None, "samples": []}
    leaves = np.asarray([t["leaves"] for t in trees], dtype=np.float64)
    neg = np.asarray([-t["max_logprob"] for t in trees], dtype=np.float64)
    lt, nt = float(np.percentile(leaves, percentile)), float(np.percentile(neg, percentile))
    picked = [t for t, lv, n in zip(trees, leaves, neg, strict=True) if lv >= lt and n >= nt]
    picked.sort(key=lambda t: (-t["leaves"], t["max_logprob"], t["id"], t["turn"]))
    return {"leaves_threshold": lt, "max_logprob_threshold": -nt, "samples": picked}


def describe(values: Sequence[float]) -> dict[str, float | int | None]:
    if not values:
        return {"n": 0, "mean": None, "median": None, "p10": None, "p90": None, "min": None, "max": None}
    arr = np.asarray(values, dtype=np.float64)
    return {
        "n": len(values),
        "mean": float(arr.mean()),
        "median": float(np.median(arr)),
        "p10": float(np.percentile(arr, 10)),
        "p90": float(np.percentile(arr, 90)),
        "min": float(arr.min()),
        "max": float(arr.max()),
    }


def uncertainty_section(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    trees, errors = tree_samples(rows)
    top = top_on_both(trees)
    return {
        "trees": len(trees),
        "errors": errors,
        "leaves": describe([t["leaves"] for t in trees]),
        "max_logprob": describe([t["max_logprob"] for t in trees]),
        "budget_hits": sum(1 for t in trees if t.get("budget_hit")),
        "correlations": correlations(trees),
        "top": {**top, "samples": [_sample(t) for t in top["samples"]]},
    }


def _sample(t: Mapping[str, Any]) -> dict[str, Any]:
    keys = (
        "id",
        "source",
        "turn",
        "leaves",
        "complete_leaves",
        "max_logprob",
        "length_chars",
        "verdict_complete",
        "best_branch",
        "budget_hit",
    )
    return {k: t.get(k) for k in keys}
