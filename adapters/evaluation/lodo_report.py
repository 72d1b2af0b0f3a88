"""``lodo.md`` and ``lodo.png`` of the base-against-base leave-one-out run (``adapters.evaluation.lodo``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def _f(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def _ci(p: dict[str, Any] | None, metric: str) -> str:
    if p is None or p.get(metric) is None:
        return "-"
    lo_hi = p["interval"].get(metric)
    return f"{_f(p[metric])} ({lo_hi[0]:.2f}-{lo_hi[1]:.2f})" if lo_hi else _f(p[metric])


def results_table(doc: dict[str, Any]) -> list[str]:
    bases = doc["bases"]
    head = "| held-out data set | " + " | ".join(
        f"{b}: F1(c) greedy | {b}: F1(c) calibrated threshold | {b}: ROC-AUC" for b in bases
    )
    lines = [head + " |", "|---|" + "---|" * (3 * len(bases))]
    for d in doc["datasets"]:
        cells = []
        for b in bases:
            p = doc["points"].get(f"{b}/{d}")
            cells += [_ci(p, "f1_complete"), _ci((p or {}).get("threshold"), "f1_complete"), _ci(p, "roc_auc")]
        lines.append(f"| {d} | " + " | ".join(cells) + " |")
    return lines


def _t(cal: dict[str, Any] | None) -> str:
    if not cal or cal["p_end_threshold"] is None:
        return "-"
    return f"{cal['p_end_threshold']:.3g} ({cal['recommended_rule']})"


def cost_table(doc: dict[str, Any]) -> list[str]:
    lines = [
        "| base | held-out data set | conversations | sequences | steps | loss first 10 -> last 10 | "
        "train s | s per conversation | scoring s (examples) | median P(end) whole / cut | "
        "calibrated t (rule it recommends) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for b in doc["bases"]:
        for d in doc["datasets"]:
            p = doc["points"].get(f"{b}/{d}")
            if p is None:
                continue
            med = p["p_end_median"]
            lines.append(
                f"| {b} | {d} | {sum(p['trained_on'].values())} | {p['sequences']} | {p['steps']} | "
                f"{p['loss_first_10']:.2f} -> {p['loss_last_10']:.2f} | {p['train_seconds']} | "
                f"{p['train_seconds_per_conversation']} | {p['score_seconds']} ({p['examples']}) | "
                f"{med['complete']:.3g} / {med['cut']:.3g} | {_t(p.get('calibration'))} |"
            )
    return lines


PANELS = (
    ("F1 (complete), greedy rule", None, "f1_complete"),
    ("F1 (complete), calibrated threshold", "threshold", "f1_complete"),
    ("ROC-AUC of P(end)", None, "roc_auc"),
)


def _bar(p: dict[str, Any] | None, part: str | None, metric: str) -> tuple[float, list[float]]:
    """A bar's height and its error bar (a point estimate may fall outside its percentile interval)."""
    q = (p or {}).get(part) if part else p
    if not q or q.get(metric) is None:
        return 0.0, [0.0, 0.0]
    v, lo_hi = float(q[metric]), q["interval"].get(metric)
    return v, [max(v - lo_hi[0], 0.0), max(lo_hi[1] - v, 0.0)] if lo_hi else [0.0, 0.0]


def plot(doc: dict[str, Any], path: Path) -> None:
    datasets, bases = doc["datasets"], doc["bases"]
    fig, axes = plt.subplots(1, len(PANELS), figsize=(15, 3.8), sharey=True)
    width = 0.8 / max(len(bases), 1)
    for ax, (title, part, metric) in zip(axes, PANELS, strict=True):
        for i, b in enumerate(bases):
            bars = [_bar(doc["points"].get(f"{b}/{d}"), part, metric) for d in datasets]
            xs = [k + (i - (len(bases) - 1) / 2) * width for k in range(len(datasets))]
            yerr = [[e[0] for _, e in bars], [e[1] for _, e in bars]]
            ax.bar(xs, [v for v, _ in bars], width, label=b, yerr=yerr, capsize=3)
        ax.set_xticks(range(len(datasets)))
        ax.set_xticklabels(datasets, rotation=20)
        ax.set_title(title)
        ax.set_ylim(0, 1.05)
        if metric == "roc_auc":
            ax.axhline(0.5, color="grey", lw=0.8, ls="--")
    axes[0].legend()
    fig.suptitle("Leave one data set out: the same recipe and data on each base (95 % bootstrap)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_lodo_report(out: Path, doc: dict[str, Any]) -> None:
    plot(doc, out / "lodo.png")
    lines = [
        "# Leave one data set out, base against base",
        "",
        f"Command: `{doc['command']}`",
        "",
        f"For each held-out data set D and each base, a LoRA adapter was trained with the bundled adapter's "
        f"recipe on the first {doc['per_dataset']} train-side conversations of every other data set, then "
        f"scored on D's test side under the truncation protocol (the first {doc['test_per_label']} whole and "
        "the first as many cut examples). Greedy rule (the paper's): the end tag is the argmax. Calibrated "
        f"threshold: P(end) >= t, with t calibrated as onboarding does, on D's first {doc.get('calibrate', '-')} "
        "train-side conversations, unlabelled (whole copy = complete, cut copy = incomplete), with no training "
        "on D. In brackets, 95 % bootstrap intervals over conversations.",
        "",
        *results_table(doc),
        "",
        "## Cost (this machine, CPU)",
        "",
        *cost_table(doc),
        "",
        "![leave one data set out](lodo.png)",
        "",
    ]
    (out / "lodo.md").write_text("\n".join(lines), encoding="utf-8")
