"""The alert evaluation's report: Markdown, a self-contained HTML page, and the earliness figure."""

from __future__ import annotations

import base64
import html
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from sidecar.tools.eval.alert_eval import ANY
from sidecar.tools.eval.figures import _pyplot, _save

HEAD = (
    "alerter",
    "alerts",
    "per 1k turns",
    "precision",
    "recall",
    "F1",
    "alert precision",
    "lead (user turns)",
    "lead (messages)",
)


def fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _with_ci(row: Mapping[str, Any], key: str) -> str:
    ci = row["ci"].get(key)
    text = fmt(row[key])
    return text if ci is None else f"{text} ({ci[0]:.2f} to {ci[1]:.2f})"


def _cells(name: str, row: Mapping[str, Any]) -> list[str]:
    return [
        name,
        fmt(row["alerts"]),
        fmt(row["alerts_per_1000_turns"], 1),
        _with_ci(row, "precision"),
        _with_ci(row, "recall"),
        _with_ci(row, "f1"),
        fmt(row["alert_precision"]),
        _with_ci(row, "median_lead_user_turns"),
        fmt(row["median_lead_messages"], 1),
    ]


def outcome_rows(found: Mapping[str, Any]) -> list[list[str]]:
    rows = []
    for kind, row in found["alerters"].items():
        rows.append(_cells(kind, row))
        for b, brow in row["baselines"].items():
            rows.append(_cells(f"  {b} (same count)", brow))
    return rows


def _md_table(head: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


GOAL_HEAD = (
    "alerter",
    "alert rate",
    "rate <= 5 %",
    "precision / base rate",
    ">= 3x",
    "median lead",
    ">= 1 turn",
    "precision - length (95 %)",
    "above length",
    "all met",
)


def _goal_rows(goals: Mapping[str, Any]) -> list[list[str]]:
    out = []
    for kind, g in goals.get("alerters", {}).items():
        gap = g["precision_minus_length_ci"]
        out.append(
            [
                kind,
                fmt(g["alert_rate"]),
                fmt(g["rate_ok"]),
                fmt(g["lift"], 2),
                fmt(g["lift_ok"]),
                fmt(g["median_lead_user_turns"], 1),
                fmt(g["lead_ok"]),
                "—" if gap is None else f"{gap[0]:+.2f} to {gap[1]:+.2f}",
                fmt(g["above_length_ok"]),
                fmt(g["all_met"]),
            ]
        )
    return out


def _rule_rows(found: Mapping[str, Any]) -> list[list[str]]:
    return [_cells(rule, row) for rule, row in found["rules"].items()]


def markdown(summary: Mapping[str, Any], run: Mapping[str, Any]) -> str:
    parts = ["# Alert evaluation", "", f"Command: `{run['command']}`", ""]
    parts += [f"- {k}: {v}" for k, v in run.items() if k != "command"]
    parts += [
        "",
        "Intervals: 95 % bootstrap over conversations. Lead: user turns / messages after the first "
        "alert until the last message, median over flagged failed conversations. Baselines fire as many "
        "alerts as the row above them.",
        "",
    ]
    for name, found in summary["outcomes"].items():
        a = found["alerters"].get(ANY)
        base = "" if a is None else f" ({a['positives']} of {a['copies']} positive, base rate {fmt(a['base_rate'])})"
        parts += [f"## {name}{base}", "", _md_table(HEAD, outcome_rows(found)), ""]
        parts += [
            f"Candidate uncertain-turn rules, top {5} % of user turns, ranked over the set:",
            "",
            _md_table(HEAD, _rule_rows(found)),
            "",
        ]
    g = summary["goals"]
    parts += [f"## Goals on {g['outcome']}", ""]
    parts += [_md_table(GOAL_HEAD, _goal_rows(g)) if g.get("measured") else "not measured: no STAR labels in the input"]
    parts += ["", "![accuracy against earliness](figures/earliness.png)", ""]
    return "\n".join(parts)


def earliness_figure(summary: Mapping[str, Any], out: Path) -> Path | None:
    outcomes = summary["outcomes"]
    if not outcomes:
        return None
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(outcomes), figsize=(4.2 * len(outcomes), 3.6), squeeze=False)
    for ax, (name, found) in zip(axes[0], outcomes.items(), strict=True):
        for alerter, curve in found["earliness"].items():
            xs = [100 * p["fraction"] for p in curve]
            ys = [p["f1"] if p["f1"] is not None else 0.0 for p in curve]
            ax.plot(xs, ys, marker="o", linestyle="--" if "(at" in alerter else "-", label=alerter)
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("verdict after % of user turns")
        ax.set_ylabel("F1 (conversations)")
        ax.set_ylim(0, 1)
    axes[0][0].legend(fontsize=6)
    return _save(fig, out / "earliness.png")


def render_html(summary: Mapping[str, Any], run: Mapping[str, Any], figure: Path | None) -> str:
    def table(head: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
        th = "".join(f"<th>{html.escape(h)}</th>" for h in head)
        body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in rows)
        return f"<table><tr>{th}</tr>{body}</table>"

    body = [f"<h1>Alert evaluation</h1><p>Command: <code>{html.escape(str(run['command']))}</code></p><ul>"]
    body += [f"<li>{html.escape(k)}: {html.escape(str(v))}</li>" for k, v in run.items() if k != "command"]
    body.append("</ul>")
    for name, found in summary["outcomes"].items():
        body += [f"<h2>{html.escape(name)}</h2>", table(HEAD, outcome_rows(found))]
        body += ["<p>Candidate uncertain-turn rules (top 5 % of user turns):</p>", table(HEAD, _rule_rows(found))]
    if summary["goals"].get("measured"):
        body += [
            f"<h2>Goals on {html.escape(summary['goals']['outcome'])}</h2>",
            table(GOAL_HEAD, _goal_rows(summary["goals"])),
        ]
    if figure is not None:
        data = base64.b64encode(figure.read_bytes()).decode()
        body.append(f'<h2>Accuracy against earliness</h2><img alt="earliness" src="data:image/png;base64,{data}">')
    style = (
        "body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;font-size:12px}"
        "td,th{border:1px solid #ccc;padding:3px 6px}"
    )
    csp = "default-src 'none'; img-src data:; style-src 'unsafe-inline'"
    return (
        '<!doctype html><html><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{csp}">'
        f"<title>Alert evaluation</title><style>{style}</style></head><body>{''.join(body)}</body></html>\n"
    )
