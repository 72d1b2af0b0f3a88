"""``report.html``: one self-contained page (inline CSS, figures as data: URIs, trees as inline
SVG, no script, a Content-Security-Policy that forbids any fetch), readable offline.

Every number on the page comes from :func:`build_summary`, which reads only the rows of
``results.jsonl`` and ``clusters.json``; ``summary.json`` holds the same numbers for machines.
All text from the dataset or the model (ids, sources, branches, cluster labels) is escaped with
the tree renderer's :func:`~sidecar.trees.svg.escape`.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from sidecar.contract import TreeBranch
from sidecar.tools.eval.metrics import completion_section, tree_samples, uncertainty_section
from sidecar.tools.judge.report import MethodRow
from sidecar.trees.pages import CSS
from sidecar.trees.shape import build_shape
from sidecar.trees.svg import clip, escape, render_svg

TREES_DRAWN = 3
MAX_TOP_ROWS = 50
MAX_CLUSTER_ROWS = 30
CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"


def fmt(value: Any, digits: int = 3) -> str:
    """How every number is printed (tests read the page back with the same rule)."""
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        text = f"{value:.{digits}f}"
        return text[1:] if text.startswith("-") and not text.strip("-0.") else text  # no "-0.000"
    return escape(str(value))


def build_summary(
    rows: Sequence[Mapping[str, Any]], clusters: Mapping[str, Any], run: Mapping[str, Any]
) -> dict[str, Any]:
    """Every figure the page shows, from the rows alone."""
    return {
        "run": dict(run),
        "conversations": len(rows),
        "completion": completion_section(rows),
        "uncertainty": uncertainty_section(rows),
        "goals": {k: v for k, v in clusters.items() if k != "assignments"},
    }


def _img(path: Path | None, alt: str) -> str:
    if path is None or not path.exists():
        return ""
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    return (
        f'<figure><img alt="{escape(alt)}" src="data:image/png;base64,{data}">'
        f"<figcaption>{escape(alt)}</figcaption></figure>"
    )


def _table(head: Sequence[str], rows: Sequence[Sequence[str]], cls: str = "") -> str:
    th = "".join(f"<th>{h}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in rows)
    return f'<table class="{cls}"><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>'


def _metric_cells(m: Mapping[str, Any]) -> list[str]:
    pc, pi = m["positive_complete"], m["positive_incomplete"]
    return [
        fmt(m["n"]),
        fmt(m["complete"]),
        fmt(m["incomplete"]),
        fmt(m["accuracy"]),
        fmt(pc["precision"]),
        fmt(pc["recall"]),
        fmt(pc["f1"]),
        fmt(pi["precision"]),
        fmt(pi["recall"]),
        fmt(pi["f1"]),
        fmt(m["roc_auc"]),
    ]


METRIC_HEAD = (
    "rows",
    "n",
    "complete",
    "incomplete",
    "accuracy",
    "P (complete)",
    "R (complete)",
    "F1 (complete)",
    "P (incomplete)",
    "R (incomplete)",
    "F1 (incomplete)",
    "ROC-AUC of P(end)",
)


def _completion(s: Mapping[str, Any], figs: Mapping[str, Path], judge: Sequence[MethodRow]) -> str:
    rows = []
    if s["overall"] is not None:
        rows.append(["all (protocol)", *_metric_cells(s["overall"])])
    rows += [[escape(src), *_metric_cells(m)] for src, m in s["by_source"].items()]
    if s["real_labels"] is not None:
        rows.append(["real labels (meta.completed, full conversations)", *_metric_cells(s["real_labels"])])
    parts = [
        '<section id="completion"><h2>Completion (Table 2 protocol)</h2>',
        "<p>Each conversation is scored twice through the sidecar's completion path: in full (label "
        "<b>complete</b>, the positive class) and truncated after a random turn k in 1..n-1 (label "
        "<b>incomplete</b>). Predicted complete iff the greedy next token is the end tag; P(end) ranks "
        "for the ROC. Precision, recall and F1 are given with each class as the positive one. "
        f"Scoring errors (left out): {fmt(s['errors'])}.</p>",
        _table(METRIC_HEAD, rows, "metrics"),
    ]
    if judge:
        parts.append(
            '<h3 id="judge">Beside an LLM judge</h3><p>The same examples; a judgement that was malformed or '
            "failed counts as incomplete (undecided). Cost per example.</p>"
            + _table(
                (
                    "method",
                    "judge-free",
                    "n",
                    "accuracy",
                    "P (complete)",
                    "R (complete)",
                    "F1 (complete)",
                    "undecided",
                    "calls",
                    "prompt tokens",
                    "generated tokens",
                ),
                [
                    [
                        escape(r.method),
                        fmt(r.judge_free),
                        fmt(r.n),
                        fmt(r.accuracy),
                        fmt(r.precision),
                        fmt(r.recall),
                        fmt(r.f1),
                        fmt(r.undecided),
                        fmt(r.calls_per_conversation, 2),
                        fmt(r.prompt_tokens_per_conversation, 1),
                        fmt(r.completion_tokens_per_conversation, 1),
                    ]
                    for r in judge
                ],
                "metrics",
            )
        )
    parts += [_img(figs.get("roc"), "ROC of P(end)"), _img(figs.get("p_end_hist"), "P(end) by class"), "</section>"]
    return "".join(parts)


def _uncertainty(u: Mapping[str, Any], figs: Mapping[str, Path]) -> str:
    stats = [
        [name, *(fmt(u[key][k]) for k in ("n", "mean", "median", "p10", "p90", "min", "max"))]
        for name, key in (("leaves", "leaves"), ("max logprob", "max_logprob"))
    ]
    corr_rows = []
    for group, pairs in u["correlations"].items():
        for pair, c in pairs.items():
            corr_rows.append([escape(group), escape(pair), fmt(c["n"]), fmt(c["pearson"]), fmt(c["spearman"])])
    return "".join(
        [
            '<section id="uncertainty"><h2>Response-tree uncertainty (Figure 6, Table 3)</h2>',
            f"<p>{fmt(u['trees'])} trees ({fmt(u['errors'])} failed, {fmt(u['budget_hits'])} cut by a budget). Max "
            "logprob is the most probable complete branch's path logprob, or the most probable partial one's when a "
            "budget stopped every branch (as alerts report it). Length: characters of the conversation up to the "
            "tree's user message.</p>",
            _table(("statistic", "n", "mean", "median", "p10", "p90", "min", "max"), stats, "metrics"),
            _img(figs.get("hist"), "Leaves and max logprob per tree (paper Figure 6)"),
            "<h3>Correlations (Table 3)</h3>",
            _table(("group", "pair", "n", "Pearson r", "Spearman r"), corr_rows, "metrics"),
            _img(figs.get("scatter"), "Max logprob against leaves and against length (Figures 12, 13)"),
            "</section>",
        ]
    )


def _top(u: Mapping[str, Any], rows: Sequence[Mapping[str, Any]], goal_of: Mapping[str, str]) -> str:
    top = u["top"]
    samples = top["samples"]
    trees = {(t["id"], t["turn"]): t for t in tree_samples(rows)[0]}
    table = _table(
        ("conversation", "source", "turn", "leaves", "max logprob", "verdict complete", "goal", "most probable branch"),
        [
            [
                escape(clip(s["id"], 80)),
                escape(s["source"]),
                fmt(s["turn"]),
                fmt(s["leaves"]),
                fmt(s["max_logprob"]),
                fmt(s["verdict_complete"]),
                escape(goal_of.get(s["id"], "—")),
                f'<span class="branch">{escape(clip(s["best_branch"] or "", 400))}</span>',
            ]
            for s in samples[:MAX_TOP_ROWS]
        ],
        "metrics",
    )
    drawn = []
    for s in samples[:TREES_DRAWN]:
        branches = [branch_of(b) for b in trees[(s["id"], s["turn"])]["branches"]]
        svg = render_svg(build_shape(branches, keep_text=True), title=f"response tree of {s['id']} turn {s['turn']}")
        drawn.append(
            f"<h3>{escape(clip(s['id'], 80))}, turn {fmt(s['turn'])}: {fmt(s['leaves'])} leaves, "
            f'max logprob {fmt(s["max_logprob"])}</h3><div class="scroll">{svg}</div>'
        )
    return "".join(
        [
            '<section id="top"><h2>Top 10% on both (Appendix C.2.2)</h2>',
            f"<p>Trees at or above the 90th percentile of leaves (≥ {fmt(top['leaves_threshold'])}) and at or below "
            f"the 10th percentile of max logprob (≤ {fmt(top['max_logprob_threshold'])}): {fmt(len(samples))} "
            f"samples, most leaves first{'' if len(samples) <= MAX_TOP_ROWS else f', the first {MAX_TOP_ROWS} listed'}; "
            f"the first {min(TREES_DRAWN, len(samples))} drawn (hover a branch for its text).</p>",
            table if samples else "<p>No tree is in the top 10% on both.</p>",
            *drawn,
            "</section>",
        ]
    )


def branch_of(row: Sequence[Any]) -> TreeBranch:
    """A branch as ``results.jsonl`` stores it: [parent, split, text, logprob, complete, truncated]."""
    parent, split, text, logprob, complete, truncated = row
    return TreeBranch(
        parent, int(split), str(text), float("-inf") if logprob is None else float(logprob), bool(complete), truncated
    )


def _goals(g: Mapping[str, Any], fig: Path | None) -> str:
    if not g.get("clusters"):
        return (
            '<section id="goals"><h2>Goal clusters (Figures 3, 5)</h2><p>Not clustered: '
            f"{escape(str(g.get('skipped', 'disabled')))}.</p></section>"
        )
    rows = [
        [fmt(i + 1), escape(clip(str(c["label"]), 120)), fmt(c["size"]), fmt(c["scored"]), fmt(c["completion_rate"])]
        for i, c in enumerate(g["clusters"][:MAX_CLUSTER_ROWS])
    ]
    return "".join(
        [
            '<section id="goals"><h2>Goal clusters (Figures 3, 5)</h2>',
            f"<p>{fmt(g['k'])} clusters ({escape(str(g['mode']))} mode), largest first"
            f"{f', the first {MAX_CLUSTER_ROWS} listed' if g['k'] > MAX_CLUSTER_ROWS else ''}. Completion rate: the "
            "share of a cluster's conversations whose full transcript the sidecar calls complete.</p>",
            _img(fig, "Largest goal clusters with their completion rates"),
            _table(("#", "label", "conversations", "scored", "completion rate"), rows, "metrics"),
            "</section>",
        ]
    )


def render_report(
    summary: Mapping[str, Any],
    rows: Sequence[Mapping[str, Any]],
    clusters: Mapping[str, Any],
    figs: Mapping[str, Path | None],
    judge: Sequence[MethodRow] = (),
) -> str:
    run = summary["run"]
    run_rows = [[escape(str(k)), escape(str(v))] for k, v in run.items()]
    labels = {c["cluster"]: str(c["label"]) for c in clusters.get("clusters", [])}
    goal_of = {cid: labels.get(c, "—") for cid, c in clusters.get("assignments", {}).items()}
    img = {k: v for k, v in figs.items() if v is not None}
    body = [
        f"<h1>Evaluation report: {escape(str(run.get('input', '')))}</h1>",
        f'<section id="run"><h2>Run</h2><p>{fmt(summary["conversations"])} conversations scored.</p>',
        _table(("setting", "value"), run_rows),
        "</section>",
        _completion(summary["completion"], img, judge),
        _uncertainty(summary["uncertainty"], img),
        _top(summary["uncertainty"], rows, goal_of),
        _goals(summary["goals"], figs.get("clusters")),
    ]
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
        f"<title>sidecar eval: {escape(str(run.get('input', '')))}</title>"
        f"<style>{CSS}figure{{margin:1em 0}}figure img{{max-width:100%}}figcaption{{color:#666;font-size:.9em}}"
        "span.branch{white-space:pre-wrap;font-family:monospace;font-size:.9em}</style></head><body>"
        + "".join(body)
        + "</body></html>"
    )
