"""The onboarding report: ``report.json``, ``report.md`` and ``pend.png`` next to the adapter."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def _f(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def _row(title: str, m: dict[str, Any] | None) -> str:
    if m is None:
        return f"| {title} | - | - | - | - | - |"
    c, i = m["complete"], m["incomplete"]
    return (
        f"| {title} | {_f(c['precision'])} | {_f(c['recall'])} | {_f(c['f1'])} | {_f(i['f1'])} | {_f(m['accuracy'])} |"
    )


def training_line(train: dict[str, Any]) -> str:
    """Steps, batch and its micro-batches, throughput and peak memory of the training step."""
    if "tokens_per_second" not in train:  # a training step recorded before these were measured
        return f"Training: {train.get('steps', '-')} steps in {train.get('train_seconds', '-')} s."
    mem = train["memory"]
    if mem["kind"] == "gpu":
        where = (
            f"peak GPU memory {mem['peak_allocated_gib']} GiB allocated, {mem['peak_reserved_gib']} GiB reserved "
            f"of {mem['device_total_gib']} GiB ({mem['device']})"
        )
        allocator = train.get("cuda_allocator")
        if allocator:
            where += f"; allocator `{allocator['variable']}={allocator['value']}` ({allocator['source']})"
    else:
        where = f"on CPU, peak resident memory of the process {mem['peak_rss_gib']} GiB (no GPU figures)"
    return (
        f"Training: {train['steps']} steps in {train['train_seconds']} s, micro-batches of "
        f"{train['micro_batch_size']} ({train['gradient_accumulation_steps']} per optimiser step), "
        f"{train['tokens_per_second']:g} tokens/s; {where}."
    )


def markdown(doc: dict[str, Any]) -> str:
    v, s, data = doc["validation"], doc["serve"], doc["split"]
    after, before = v["after"], v["before"]
    trust = "trusted" if v["trusted"] else f"UNTRUSTED (below the floor {v['min_validation_f1']})"
    lines = [
        f"# Onboarding of agent `{doc['agent']}`",
        "",
        f"Adapter `{s['served_name']}` ({trust}): rule **{v['rule']}**"
        + (f", P(end) threshold {v['p_end_threshold']:.4g}" if v["p_end_threshold"] is not None else "")
        + f", validation F1 {v['validation_f1']:.3f}.",
        "",
        f"Data: {doc['collect']['conversations']} conversations ({data['train']} trained on, {data['holdback']} "
        f"held back, {data['general']} general ones mixed in). Validation: the truncation protocol on the "
        f"held-back slice, label-free ({after['examples']} examples from {after['conversations']} conversations; "
        "each whole = complete, cut after a random earlier turn = incomplete).",
        "",
        training_line(doc["train"]),
        "",
        "| rule | P(c) | R(c) | F1(c) | F1(i) | acc |",
        "|---|---|---|---|---|---|",
        _row("before onboarding, greedy", before["greedy"]),
        _row("greedy (end tag is the argmax)", after["greedy"]),
        _row("threshold, in sample (optimistic)", after["threshold_in_sample"]),
        _row("threshold, cross-validated", after["threshold_cross_validated"]),
        "",
        f"ROC-AUC of P(end): {_f(before['greedy']['roc_auc'])} before, {_f(after['greedy']['roc_auc'])} after.",
        "",
        f"Serving: {s['status']}."
        + (
            f" Restart command (the vLLM CPU build `.ci/setup` installs):\n\n    {s['restart_command']}\n"
            + (
                f"\nOn a GPU install of vLLM:\n\n    {s['restart_command_gpu']}\n"
                if s.get("restart_command_gpu")
                else ""
            )
            if s["status"] in ("not_requested", "runtime_loading_disabled")
            else ""
        ),
        "",
        f"Routing: `{doc['route']['snippet']}`"
        + (f", patched into `{doc['route']['patched']}`" if doc["route"]["patched"] else "")
        + ".",
        "",
        "| step | seconds | skipped |",
        "|---|---|---|",
        *(f"| {k} | {t['seconds']} | {'yes' if t['skipped'] else ''} |" for k, t in doc["timings"].items()),
        "",
        f"Wall time: {doc['wall_seconds']} s.",
        "",
        "![P(end) on the held-back slice](pend.png)",
        "",
    ]
    return "\n".join(lines)


def plot(p_end: dict[str, list[float]], threshold: float | None, path: Path) -> None:
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.2), sharey=True)
    logs = [math.log10(max(p, 1e-12)) for k in p_end for p in p_end[k]]
    lo = min(logs, default=-12.0)
    bins = [lo + (0.0 - lo) * i / 30 for i in range(31)]
    for ax, (title, keys) in zip(
        axes, (("before", ("before_complete", "before_incomplete")), ("after", ("complete", "incomplete"))), strict=True
    ):
        for key, color in zip(keys, ("tab:green", "tab:red"), strict=True):
            ax.hist(
                [math.log10(max(p, 1e-12)) for p in p_end[key]],
                bins=bins,
                alpha=0.6,
                color=color,
                label="whole (complete)" if color == "tab:green" else "truncated (incomplete)",
            )
        if threshold is not None and title == "after":
            ax.axvline(math.log10(threshold), color="black", linestyle="--", label="threshold")
        ax.set_title(f"{title} onboarding", fontsize=9)
        ax.set_xlabel("log10 P(end tag)")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def write(out: Path, doc: dict[str, Any]) -> dict[str, str]:
    (out / "report.json").write_text(json.dumps(doc, indent=2, default=str) + "\n")
    (out / "report.md").write_text(markdown(doc))
    plot(doc["validation"]["p_end"], doc["validation"]["p_end_threshold"], out / "pend.png")
    return {"markdown": str(out / "report.md"), "json": str(out / "report.json"), "plot": str(out / "pend.png")}
