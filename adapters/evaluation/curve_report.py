"""``curve.md`` and ``curve.png`` of the leave-one-data-set-out onboarding curve (``adapters.evaluation.curve``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

TARGET_F1 = 0.90
TARGET_N = 200


def _f(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def table(doc: dict[str, Any], datasets: list[str], sizes: list[int]) -> list[str]:
    lines = [
        "| data set | N (used) | F1(c) greedy | F1(i) greedy | F1(c) threshold | F1(i) threshold | ROC-AUC | "
        "rule chosen | validation F1 | onboarding s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for d in datasets:
        for size in sizes:
            p = doc["points"].get(f"{d}/{size}")
            if p is None or "skipped" in p:
                continue
            g, t = p["greedy"], p.get("threshold")
            lines.append(
                f"| {d} | {size} ({p['n']}) | {_f(g['f1_complete'])} | {_f(g['f1_incomplete'])} | "
                f"{_f(t['f1_complete'] if t else None)} | {_f(t['f1_incomplete'] if t else None)} | "
                f"{_f(g['roc_auc'])} | {p.get('recommended_rule', '-')} | {_f(p.get('validation_f1'))} | "
                f"{p['onboarding_seconds']} |"
            )
    return lines


def verdicts(doc: dict[str, Any], datasets: list[str]) -> list[str]:
    """Per data set with a ceiling >= 0.90: the best F1 at N <= 200, under the recommended rule."""
    out = []
    for d in datasets:
        ceiling = doc["ceilings"].get(d)
        pts = [
            p
            for k, p in doc["points"].items()
            if k.startswith(f"{d}/") and "skipped" not in p and 0 < p["n"] <= TARGET_N
        ]
        chosen = [
            (
                p["n"],
                (p["threshold"] if p.get("recommended_rule") == "threshold" and p["threshold"] else p["greedy"])[
                    "f1_complete"
                ],
            )
            for p in pts
        ]
        first = min((n for n, f1 in chosen if f1 >= TARGET_F1), default=None)
        best = max((f1 for _, f1 in chosen), default=None)
        applies = ceiling is not None and ceiling >= TARGET_F1
        status = ("met" if first is not None else "MISSED") if applies else "no target (ceiling < 0.90)"
        out.append(f"| {d} | {_f(ceiling)} | {_f(best)} | {first if first is not None else '-'} | {status} |")
    return [
        "| data set | supervised ceiling | best F1(c) with N <= 200, rule chosen by onboarding | "
        "smallest N reaching 0.90 | target |",
        "|---|---|---|---|---|",
        *out,
    ]


def elsewhere(doc: dict[str, Any]) -> list[str]:
    """F1(c) greedy / ROC-AUC on other data sets' test sides, for points that measured them (forgetting)."""
    pts = [(k, p) for k, p in doc["points"].items() if p.get("elsewhere")]
    if not pts:
        return []
    others = sorted({d for _, p in pts for d in p["elsewhere"]})
    lines = [
        "| point | general mixed in | " + " | ".join(f"{d} F1(c) / AUC" for d in others) + " |",
        "|---|---|" + "---|" * len(others),
    ]
    for k, p in pts:
        cells = [f"{_f(p['elsewhere'][d]['f1_complete'])} / {_f(p['elsewhere'][d]['roc_auc'])}" for d in others]
        lines.append(f"| {k} | {p.get('general_mixed_in', 0)} | " + " | ".join(cells) + " |")
    return lines


def plot(doc: dict[str, Any], datasets: list[str], sizes: list[int], path: Path) -> None:
    fig, axes = plt.subplots(1, len(datasets), figsize=(3.3 * len(datasets), 3.2), sharey=True, squeeze=False)
    for ax, d in zip(axes[0], datasets, strict=True):
        pts = sorted((p["n"], p) for k, p in doc["points"].items() if k.startswith(f"{d}/") and "skipped" not in p)
        xs = [max(n, 1) for n, _ in pts]
        ax.plot(xs, [p["greedy"]["f1_complete"] for _, p in pts], "o-", label="F1(c) greedy")
        thr = [(max(n, 1), p["threshold"]["f1_complete"]) for n, p in pts if p.get("threshold")]
        if thr:
            ax.plot(*zip(*thr, strict=True), "s--", label="F1(c) threshold")
        ax.plot(xs, [p["greedy"]["roc_auc"] or 0.0 for _, p in pts], "^:", label="ROC-AUC")
        if d in doc["ceilings"]:
            ax.axhline(doc["ceilings"][d], color="grey", linestyle="-.", linewidth=1, label="supervised ceiling")
        ax.axhline(TARGET_F1, color="red", linewidth=0.6)
        ax.set_xscale("symlog", linthresh=25)
        ax.set_xticks([max(s, 1) for s in sizes])
        ax.set_xticklabels([str(s) for s in sizes], fontsize=7)
        ax.set_title(d, fontsize=9)
        ax.set_xlabel("own conversations used")
        ax.set_ylim(0, 1.02)
    axes[0][0].legend(fontsize=6, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def write_curve_report(out: Path, doc: dict[str, Any], datasets: list[str], sizes: list[int]) -> None:
    walls = [
        p["onboarding_seconds"]
        for k, p in doc["points"].items()
        if "skipped" not in p and p["n"] > 0 and k.endswith(f"/{TARGET_N}")
    ]
    lines = [
        "# Onboarding a new agent: leave-one-data-set-out learning curve",
        "",
        f"Command: `{doc['command']}`",
        "",
        "For each data set D, an adapter never trained on D is onboarded (`adapters onboard`'s pipeline) on N of "
        "D's train-side conversations, unlabelled, and scored on D's test side (truncation protocol, both rules; "
        "threshold = the one calibrated on the onboarding's own held-back slice).",
        "",
        *verdicts(doc, datasets),
        "",
        f"Onboarding wall time for N = {TARGET_N}: "
        + (", ".join(f"{w:.0f} s" for w in walls) if walls else "-")
        + " (target <= 300 s).",
        "",
        *table(doc, datasets, sizes),
        "",
        *elsewhere(doc),
        "",
        "![learning curve](curve.png)",
        "",
    ]
    (out / "curve.md").write_text("\n".join(lines))
    plot(doc, datasets, sizes, out / "curve.png")
