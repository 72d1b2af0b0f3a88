"""Evaluation report files: ``report.json``, ``report.md`` and ``pend_hist.png``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

METHOD_ORDER = (
    "adapter",
    "no_end_tag",
    "no_end_tag_turn_rule",
    "base_only",
    "base_only_turn_rule",
    "supervised_classifier",
)
METHOD_TITLES = {
    "adapter": "LoRA adapter + end tag (ours)",
    "no_end_tag": "adapter trained without end tag",
    "no_end_tag_turn_rule": "adapter w/o end tag, rule: next token is not TURN",
    "base_only": "base model alone",
    "base_only_turn_rule": "base alone, rule: next token is not TURN",
    "supervised_classifier": "supervised TF-IDF + LR (ceiling ref., uses labels)",
}


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def markdown(results: dict[str, Any], meta: dict[str, Any]) -> str:
    lines = [
        "# Completion detection: held-out evaluation (paper Table 2 protocol)",
        "",
        f"Command: `{meta['command']}`  ",
        f"Wall time: {meta['wall_seconds']} s; context: last "
        f"{meta['max_context_tokens']} tokens. Scored by the sidecar's own path ({meta.get('scored_by', '-')}); "
        f"P(end) read exactly, by method: {meta.get('p_end_methods', {})}. Positive class for P/R/F1 columns "
        f"marked (c) = complete, (i) = incomplete.",
        "",
    ]
    for name, sets in results.items():
        for set_name, res in sets.items():
            title = (
                "full = complete, truncated copy = incomplete"
                if set_name == "protocol"
                else f"real labels: {res['label_source']}"
            )
            n = res["adapter"]["n"]
            lines += [
                f"## {name}: {title} (n={n}, complete={res['adapter']['n_complete']})",
                "",
                "| method | acc | P(c) | R(c) | F1(c) | P(i) | R(i) | F1(i) | ROC-AUC |",
                "|---|---|---|---|---|---|---|---|---|",
            ]
            for m in METHOD_ORDER:
                if m not in res:
                    continue
                r = res[m]
                c, i = r["complete"], r["incomplete"]
                lines.append(
                    f"| {METHOD_TITLES[m]} | {_fmt(r['accuracy'])} | {_fmt(c['precision'])} | "
                    f"{_fmt(c['recall'])} | {_fmt(c['f1'])} | {_fmt(i['precision'])} | "
                    f"{_fmt(i['recall'])} | {_fmt(i['f1'])} | {_fmt(r['roc_auc'])} |"
                )
            cm = res["adapter"]["confusion"]
            lines += [
                "",
                "Adapter confusion matrix (rows true, columns predicted):",
                "",
                "| | pred complete | pred incomplete |",
                "|---|---|---|",
                f"| complete | {cm['true_complete_pred_complete']} | {cm['true_complete_pred_incomplete']} |",
                f"| incomplete | {cm['true_incomplete_pred_complete']} | {cm['true_incomplete_pred_incomplete']} |",
                "",
            ]
    lines += ["![P(end) histograms](pend_hist.png)", ""]
    return "\n".join(lines)


def plot(hist: dict[str, dict[str, list[float]]], path: Path) -> None:
    keys = list(hist)
    cols = 3
    rows = max(1, (len(keys) + cols - 1) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.0 * rows), squeeze=False)
    bins = [i / 20 for i in range(21)]
    for ax, key in zip(axes.flat, keys, strict=False):
        ax.hist(hist[key]["complete"], bins=bins, alpha=0.6, label="complete", color="tab:green")
        ax.hist(hist[key]["incomplete"], bins=bins, alpha=0.6, label="incomplete", color="tab:red")
        ax.set_title(key, fontsize=9)
        ax.set_xlabel("P(end tag | c)")
        ax.set_yscale("log")
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(keys) :]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def write_report(
    out_dir: Path, results: dict[str, Any], hist: dict[str, dict[str, list[float]]], meta: dict[str, Any]
) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "report.json").write_text(json.dumps({"meta": meta, "results": results}, indent=2) + "\n")
    (out_dir / "report.md").write_text(markdown(results, meta))
    plot(hist, out_dir / "pend_hist.png")
