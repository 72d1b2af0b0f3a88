"""Statistics of ``bench_uncertainty``: ROC-AUC with bootstrap intervals against outcomes,
calibration of the tree as a distribution, the generated Markdown and the figures."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from sklearn.metrics import roc_auc_score

from sidecar.tools.classification import grouped_bootstrap

DISCONNECTS = ("DisconnectDuringDialogue", "EarlyDisconnectDuringDialogue")
CALIBRATION_ALPHA = 0.01
LEAF_BINS = (0.0, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 1.0)


def auc(y: np.ndarray[Any, Any], s: np.ndarray[Any, Any]) -> float:
    """ROC-AUC as the Mann-Whitney statistic (ties count half), fast enough to bootstrap."""
    _, inverse, counts = np.unique(s, return_inverse=True, return_counts=True)
    ranks = (np.cumsum(counts) - (counts - 1) / 2.0)[inverse]
    pos = int(y.sum())
    return float((ranks[y].sum() - pos * (pos + 1) / 2.0) / (pos * (len(y) - pos)))


def auc_ci(y: Sequence[bool], s: Sequence[float], groups: Sequence[str], n_boot: int, seed: int = 0) -> dict[str, Any]:
    """ROC-AUC (failure positive) with a 95% percentile interval over resampled conversations."""
    y_arr, s_arr, g_arr = np.asarray(y, bool), np.asarray(s, float), np.asarray(groups)
    counts = {"pos": int(y_arr.sum()), "neg": int((~y_arr).sum())}
    # At least 5 conversations on each side: turns of one conversation are not independent samples.
    if len(set(g_arr[y_arr])) < 5 or len(set(g_arr[~y_arr])) < 5:
        return {"auc": None, "lo": None, "hi": None, **counts}
    boots = grouped_bootstrap(
        groups,
        lambda pick: auc(y_arr[pick], s_arr[pick]) if 0 < y_arr[pick].sum() < len(pick) else None,
        n_boot,
        seed,
    )
    lo, hi = np.percentile(boots, [2.5, 97.5])
    assert abs(auc(y_arr, s_arr) - roc_auc_score(y_arr, s_arr)) < 1e-9
    return {"auc": auc(y_arr, s_arr), "lo": float(lo), "hi": float(hi), **counts}


OUTCOMES: dict[str, Callable[[dict[str, Any]], bool | None]] = {
    "tau-bench task failure (reward < 1)": lambda lab: None if "reward" not in lab else lab["reward"] < 1,
    "STAR disconnected in the dialogue": lambda lab: (
        None if "completion_level" not in lab else lab["completion_level"] in DISCONNECTS
    ),
    "STAR user-reported failure": lambda lab: (
        None if not isinstance(lab.get("user_reported_task_success"), bool) else not lab["user_reported_task_success"]
    ),
}


def conv_stats(r: dict[str, Any]) -> dict[str, float]:
    out: dict[str, float] = {}
    for kind in ("live",):
        leaves = [float(t["trees"][kind]["leaves"]) for t in r["turns"]]
        lps = [float(t["trees"][kind]["max_logprob"]) for t in r["turns"]]
        out |= {
            f"{kind}: mean leaves": float(np.mean(leaves)),
            f"{kind}: max leaves": max(leaves),
            f"{kind}: -mean max logprob": -float(np.mean(lps)),
            f"{kind}: -min max logprob": -min(lps),
        }
    last = r["turns"][-1]["trees"]["live"]
    return out | {
        "live: last turn leaves": float(last["leaves"]),
        "live: last turn -max logprob": -last["max_logprob"],
        "baseline: user turns": float(len(r["turns"])),
        "reference: -P(end) of the full transcript": -r["p_end"] if r["p_end"] is not None else math.nan,
    }


def outcome_table(rows: list[dict[str, Any]], n_boot: int) -> list[dict[str, Any]]:
    out = []
    for outcome, label in OUTCOMES.items():
        labelled = [(r, label(r["labels"])) for r in rows if label(r["labels"]) is not None]
        if not labelled:
            continue
        y = [bool(v) for _, v in labelled]
        ids = [r["id"] for r, _ in labelled]
        stats = [conv_stats(r) for r, _ in labelled]
        for name in stats[0]:
            known = [i for i, s in enumerate(stats) if not math.isnan(s[name])]  # P(end) may be missing
            out.append(
                {
                    "outcome": outcome,
                    "level": "conversation",
                    "statistic": name,
                    **auc_ci([y[i] for i in known], [stats[i][name] for i in known], [ids[i] for i in known], n_boot),
                }
            )
        turns = [(r["id"], v, t) for r, v in labelled for t in r["turns"]]
        for kind in ("live",):
            for name, key, sign in (("leaves", "leaves", 1), ("-max logprob", "max_logprob", -1)):
                scores = [sign * t["trees"][kind][key] for _, _, t in turns]
                out.append(
                    {
                        "outcome": outcome,
                        "level": "turn",
                        "statistic": f"{kind}: {name}",
                        **auc_ci([bool(v) for _, v, _ in turns], scores, [i for i, _, _ in turns], n_boot),
                    }
                )
    return out


def calibration(turns: list[dict[str, Any]], bins: int = 10) -> dict[str, Any]:
    used = [t for t in turns if "hit" in t]
    if not used:
        return {"turns": 0}
    m, h = np.asarray([t["mass"] for t in used]), np.asarray([t["hit"] for t in used], float)
    tp, th = np.asarray([t["top_p"] for t in used]), np.asarray([t["hit_top"] for t in used], float)
    edges = np.linspace(0, 1, bins + 1)
    which = np.clip(np.digitize(m, edges) - 1, 0, bins - 1)
    table: list[dict[str, Any]] = [
        {
            "bin": f"{edges[b]:.1f}-{edges[b + 1]:.1f}",
            "n": int((which == b).sum()),
            "mean_mass": float(m[which == b].mean()),
            "hit_rate": float(h[which == b].mean()),
        }
        for b in range(bins)
        if (which == b).any()
    ]
    ece = sum(r["n"] * abs(r["mean_mass"] - r["hit_rate"]) for r in table) / len(used)
    # Every leaf on its own: a leaf of probability p should be the actual start p of the time.
    pairs = [(p, h) for t in used for p, h in t.get("leaves_p_hit", [])]
    per_leaf = []
    for lo, hi in itertools.pairwise(LEAF_BINS):
        inside = [(p, h) for p, h in pairs if lo <= p < hi or (hi == 1.0 and p == 1.0)]
        if inside:
            per_leaf.append(
                {
                    "bin": f"{lo:g}-{hi:g}",
                    "n": len(inside),
                    "mean_p": float(np.mean([p for p, _ in inside])),
                    "hit_rate": float(np.mean([h for _, h in inside])),
                }
            )
    return {
        "turns": len(used),
        "excluded": len(turns) - len(used),
        "mean_mass": float(m.mean()),
        "hit_rate": float(h.mean()),
        "brier": float(((h - m) ** 2).mean()),
        "ece": float(ece),
        "top_leaf_mean_p": float(tp.mean()),
        "top_leaf_hit_rate": float(th.mean()),
        "bins": table,
        "per_leaf": per_leaf,
    }


def plot(report: dict[str, Any], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    depths = [k for k in ("k1", "k2", "k4") if any(c.get(k, {}).get("turns") for c in report["calibration"].values())]
    fig, axes = plt.subplots(1, len(depths), figsize=(4.6 * len(depths), 4.6), squeeze=False)
    for ax, depth in zip(axes[0], depths, strict=True):
        ax.plot([0, 1], [0, 1], color="#999", linestyle=":", linewidth=1)
        for name, by_depth in report["calibration"].items():
            bins = [b for b in by_depth.get(depth, {}).get("per_leaf", []) if b["n"] >= 20]
            if bins:
                ax.plot(
                    [b["mean_p"] for b in bins],
                    [b["hit_rate"] for b in bins],
                    marker="o",
                    linewidth=1.1,
                    markersize=3.5,
                    label=f"{name} ({sum(b['n'] for b in bins)} leaves)",
                )
        ax.set(
            xlabel="leaf probability (binned, >= 20 leaves a bin)",
            ylabel="the actual response starts with it",
            title=f"first {depth[1:]} token(s), every leaf, alpha {CALIBRATION_ALPHA}",
            xlim=(0, 1),
            ylim=(0, 1),
        )
        ax.legend(fontsize=6, loc="upper left")
    fig.tight_layout()
    fig.savefig(out / "calibration.png", dpi=110, metadata={"Software": None})
    plt.close(fig)

    panels = sorted({(r["set"], r["outcome"]) for r in report["auc"] if r["auc"] is not None})
    if not panels:
        return
    fig, axes = plt.subplots(len(panels), 1, figsize=(7.6, 3.6 * len(panels)), squeeze=False)
    for ax, (set_name, outcome) in zip(axes[:, 0], panels, strict=True):
        rows = [r for r in report["auc"] if (r["set"], r["outcome"]) == (set_name, outcome) and r["auc"] is not None]
        for i, r in enumerate(rows):
            color = "#888" if r["statistic"].startswith(("baseline", "reference")) else "#d9480f"
            ax.errorbar(
                r["auc"],
                i,
                xerr=[[r["auc"] - r["lo"]], [r["hi"] - r["auc"]]],
                fmt="o",
                color=color,
                capsize=2,
                markersize=4,
            )
        ax.axvline(0.5, color="#999", linestyle=":")
        ax.set_yticks(range(len(rows)), [f"{r['statistic']} ({r['level']})" for r in rows], fontsize=7)
        ax.set_xlim(0.0, 1.0)
        ax.set_title(f"{set_name}: {outcome} ({rows[0]['pos']} failures, {rows[0]['neg']} others)", fontsize=9)
    axes[-1, 0].set_xlabel("ROC-AUC, failure as positive (95% bootstrap interval over conversations)")
    fig.tight_layout()
    fig.savefig(out / "auc.png", dpi=110, metadata={"Software": None})
    plt.close(fig)


def _f(v: Any) -> str:
    return "—" if v is None else f"{v:.3f}" if isinstance(v, float) else str(v)


def markdown(report: dict[str, Any]) -> str:
    tree = report.get("tree", {"alpha": 0.05, "max_depth_tokens": 24})  # reports from before it was recorded
    lines = [
        "# Response-tree uncertainty against outcomes (generated)",
        "",
        f"Command: `{report['command']}`  ",
        f"Artifacts: {report['artifacts']}  ",
        f"Wall time: {report['seconds']:.0f} s; turns with trees: {report['trees']}",
        "",
        f"## Tree statistics (the demo's configuration: alpha {tree['alpha']}, {tree['max_depth_tokens']} tokens deep)",
        "",
        "| set | conversations | turns | tree | mean leaves | one-leaf trees | median max logprob | budget hits "
        "| P(end) missing |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for k, v in report["sets"].items():
        for kind, t in v["trees"].items():
            lines.append(
                f"| {k} | {v['conversations']} | {v['turns']} | {kind} | {_f(t['mean_leaves'])} | "
                f"{_f(t['one_leaf'])} | {_f(t['median_max_logprob'])} | {t['budget_hits']} | "
                f"{v.get('p_end_missing', 0)} |"
            )
    lines += [
        "",
        "## Calibration: does the actual response start with a leaf as often as the tree's mass says?",
        "",
        "| data | tree | turns | excluded | mean mass M | hit rate | Brier | ECE | top leaf mean p "
        "| top leaf hit rate |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for k, by_depth in report["calibration"].items():
        for depth, c in by_depth.items():
            lines.append(
                f"| {k} | {depth} | {c['turns']} | {c.get('excluded', 0)} | {_f(c.get('mean_mass'))} | "
                f"{_f(c.get('hit_rate'))} | {_f(c.get('brier'))} | {_f(c.get('ece'))} | "
                f"{_f(c.get('top_leaf_mean_p'))} | {_f(c.get('top_leaf_hit_rate'))} |"
            )
    lines += [
        "",
        "### Every leaf on its own (a leaf of probability p should come true p of the time)",
        "",
        "| data | tree | leaf probability | leaves | mean p | came true |",
        "|---|---|---|---|---|---|",
    ]
    for k, by_depth in report["calibration"].items():
        for depth, c in by_depth.items():
            lines += [
                f"| {k} | {depth} | {b['bin']} | {b['n']} | {_f(b['mean_p'])} | {_f(b['hit_rate'])} |"
                for b in c.get("per_leaf", [])
            ]
    lines += [
        "",
        "## ROC-AUC against outcomes (failure = positive; 95% bootstrap over conversations)",
        "",
        "| set | outcome | level | statistic | failures / others | AUC | 95% interval |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in report["auc"]:
        ci = "too few" if r["auc"] is None else f"{r['lo']:.3f} to {r['hi']:.3f}"
        lines.append(
            f"| {r['set']} | {r['outcome']} | {r['level']} | {r['statistic']} | {r['pos']} / {r['neg']} | "
            f"{_f(r['auc'])} | {ci} |"
        )
    return "\n".join(lines) + "\n"
