"""The report's figures as PNG files (matplotlib, Agg backend: no display needed).

matplotlib is imported here only, lazily, by ``sidecar eval``: it is in the ``dev`` and ``adapters``
extras, not in the sidecar's runtime image. Every figure is deterministic for the same rows.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from sidecar.errors import ConfigError
from sidecar.tools.eval.metrics import Example, roc_points

DPI = 110


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError as exc:
        raise ConfigError("sidecar eval draws its figures with matplotlib: pip install matplotlib") from exc
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=DPI, metadata={"Software": None})
    _pyplot().close(fig)
    return path


def completion_figures(examples: Sequence[Example], out: Path) -> dict[str, Path]:
    """ROC of P(end) (overall and per source) and log10 P(end) histograms by class."""
    plt = _pyplot()
    made: dict[str, Path] = {}
    fig, ax = plt.subplots(figsize=(5.2, 4.4))
    groups: dict[str, list[Example]] = {"all": list(examples)}
    for e in examples:
        groups.setdefault(e.source, []).append(e)
    for name, ex in groups.items():
        pts = roc_points(ex)
        if pts is not None:
            ax.plot(*pts, label=f"{name} (n={len(ex)})", linewidth=2.2 if name == "all" else 1.2)
    ax.plot([0, 1], [0, 1], color="#999", linestyle=":", linewidth=1)
    ax.set(
        xlabel="false positive rate (truncated called complete)",
        ylabel="true positive rate",
        title="ROC of P(end), positive = complete",
    )
    ax.legend(fontsize=8, loc="lower right")
    made["roc"] = _save(fig, out / "completion_roc.png")

    fig, ax = plt.subplots(figsize=(6.2, 3.8))
    floor = 1e-12
    for label, name, color in ((True, "full (complete)", "#2b8a3e"), (False, "truncated (incomplete)", "#c92a2a")):
        vals = [math.log10(max(e.p_end, floor)) for e in examples if e.label is label]
        if vals:
            ax.hist(vals, bins=30, alpha=0.55, label=f"{name}, n={len(vals)}", color=color)
    ax.set(xlabel="log10 P(end | conversation)", ylabel="examples", title="P(end) by class")
    ax.legend(fontsize=8)
    made["p_end_hist"] = _save(fig, out / "completion_p_end_hist.png")
    return made


def uncertainty_figures(trees: Sequence[Mapping[str, Any]], out: Path) -> dict[str, Path]:
    """Figure 6 (leaves and max logprob histograms, per source) and Figures 12-13 (scatters)."""
    plt = _pyplot()
    made: dict[str, Path] = {}
    sources = sorted({str(t["source"]) for t in trees})
    fig, axes = plt.subplots(2, 1, figsize=(6.4, 6.2))
    top = max((int(t["leaves"]) for t in trees), default=1)
    bins = [b + 0.5 for b in range(top + 1)] if top <= 60 else 40  # one bar per leaf count
    for src in sources:
        ts = [t for t in trees if t["source"] == src]
        axes[0].hist([t["leaves"] for t in ts], bins=bins, alpha=0.55, label=f"{src} (n={len(ts)})")
        axes[1].hist([t["max_logprob"] for t in ts], bins=30, alpha=0.55, label=src)
    axes[0].set(xlabel="leaves (branches) per response tree", ylabel="trees", title="Response tree leaves")
    axes[1].set(xlabel="max logprob (most probable branch)", ylabel="trees", title="Max logprob")
    axes[0].legend(fontsize=8)
    made["hist"] = _save(fig, out / "uncertainty_hist.png")

    fig, axes = plt.subplots(1, 2, figsize=(9.6, 3.9))
    for src in sources:
        ts = [t for t in trees if t["source"] == src]
        axes[0].scatter([t["leaves"] for t in ts], [t["max_logprob"] for t in ts], s=9, alpha=0.6, label=src)
        axes[1].scatter([t["length_chars"] for t in ts], [t["max_logprob"] for t in ts], s=9, alpha=0.6)
    axes[0].set(xlabel="leaves", ylabel="max logprob", title="Max logprob vs leaves")
    axes[1].set(xlabel="conversation length (characters)", ylabel="max logprob", title="Max logprob vs length")
    axes[1].set_xscale("symlog")
    axes[0].legend(fontsize=8)
    made["scatter"] = _save(fig, out / "uncertainty_scatter.png")
    return made


def cluster_figure(clusters: Sequence[Mapping[str, Any]], out: Path, top: int = 10) -> Path | None:
    """Figures 3/5: the largest clusters by size, each bar annotated with its completion rate."""
    if not clusters:
        return None
    plt = _pyplot()
    rows = list(clusters[:top])[::-1]
    fig, ax = plt.subplots(figsize=(8.6, 0.45 * len(rows) + 1.3))
    labels = [_short(str(r["label"])) for r in rows]
    bars = ax.barh(range(len(rows)), [r["size"] for r in rows], color="#4a6b8a")
    for bar, r in zip(bars, rows, strict=True):
        rate = r["completion_rate"]
        text = "n/a" if rate is None else f"{100 * rate:.0f}% complete"
        ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, f"  {text}", va="center", fontsize=8)
    ax.set_yticks(range(len(rows)), labels, fontsize=8)
    ax.set(xlabel="conversations", title=f"Top {len(rows)} largest goal clusters")
    ax.set_xlim(0, max(r["size"] for r in rows) * 1.35)
    return _save(fig, out / "goal_clusters.png")


def _short(label: str, limit: int = 48) -> str:
    # Labels come from conversations: printed as plain text by matplotlib, never parsed as mathtext.
    flat = " ".join(label.split()).replace("$", r"\$")
    return flat if len(flat) <= limit else flat[: limit - 1] + "\u2026"
