"""The overview page's HTML: readiness in words, completion and alert plots, goals, latest alerts.

Same rules as :mod:`sidecar.trees.pages`: no script, no inline style, every value escaped, relative
links (``escalations``, ``trees/<id>``, ``clusters`` from ``/``). The plots are small inline SVG
line charts (:func:`line_chart`) whose size is bounded by the number of points given; each series
has its colour from a fixed palette and a legend in the page.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from sidecar.trees.pages import Escalation, document, iso
from sidecar.trees.svg import clip, escape

PALETTE = ("#1f5fa8", "#d9480f", "#2b8a3e", "#862e9c", "#c92a2a", "#5c940d", "#0b7285", "#e67700", "#495057")
CHART_WIDTH = 1100
CHART_HEIGHT = 220
_PAD_LEFT, _PAD_RIGHT, _PAD_TOP, _PAD_BOTTOM = 48, 12, 10, 26
# Words for the checks /readyz names; a check not listed shows its own name.
CHECK_WORDS: Mapping[str, str] = {
    "kafka": "Kafka source (consuming the events topic)",
    "tasks": "background tasks (none has died)",
    "completion_adapters": "completion adapters (which model judges completion)",
    "alerting": "alert sinks",
    "clustering": "goal clustering",
    "goal-fleet": "goal model shared across replicas",
    "leadership": "fleet leadership (who runs the once-only jobs)",
    "vllm": "vLLM scoring server",
    "otel-bridge": "OTLP bridge",
    "otel-receiver": "OTLP receiver",
    "exposure": "operator listener exposure",
    "training_store": "training store",
}


@dataclass(frozen=True, slots=True)
class Check:
    name: str
    ready: bool
    gates: bool
    detail: str


@dataclass(frozen=True, slots=True)
class Goal:
    id: str
    name: str | None
    size: float | None
    judged: int
    completion_rate: float | None


@dataclass(frozen=True, slots=True)
class Series:
    label: str
    points: Sequence[tuple[float, float | None]]


@dataclass(frozen=True, slots=True)
class OverviewData:
    now: float
    started: float
    ready: bool
    checks: Sequence[Check]
    completion: Sequence[Series]
    alerts: Sequence[Series]
    alert_totals: Mapping[str, int]
    goals: Sequence[Goal]
    recent: Sequence[Escalation]
    with_tree: set[str] = field(default_factory=set)
    sample_seconds: float = 15.0


def _clock(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=UTC).strftime("%H:%M:%S")


def _pct(v: float | None) -> str:
    return "—" if v is None else f"{100 * v:.0f} %"


def line_chart(series: Sequence[Series], *, y_max: float | None, title: str, percent: bool = False) -> str:
    """An SVG line chart of ``series`` over their common time axis; ``y_max`` None: the data's max.
    A None value breaks a line (no data in that window)."""
    w, h = CHART_WIDTH, CHART_HEIGHT
    times = [t for s in series for t, _ in s.points]
    values = [v for s in series for _, v in s.points if v is not None and math.isfinite(v)]
    t0, t1 = (min(times), max(times)) if times else (0.0, 1.0)
    span = max(t1 - t0, 1.0)
    top: float = y_max if y_max is not None and y_max > 0 else max([1.0, *values])
    plot_w, plot_h = w - _PAD_LEFT - _PAD_RIGHT, h - _PAD_TOP - _PAD_BOTTOM

    def x(t: float) -> float:
        return _PAD_LEFT + plot_w * (t - t0) / span

    def y(v: float) -> float:
        return _PAD_TOP + plot_h * (1 - min(max(v, 0.0), top) / top)

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" width="{w}" height="{h}" viewBox="0 0 {w} {h}" '
        f'role="img" aria-label="{escape(title)}" font-family="sans-serif" font-size="12">',
        f"<title>{escape(title)}</title>",
    ]
    for frac in (0.0, 0.5, 1.0):
        tick = top * frac
        label = f"{100 * tick:.0f}%" if percent else (f"{tick:.0f}" if tick == int(tick) else f"{tick:.1f}")
        out.append(
            f'<line x1="{_PAD_LEFT}" x2="{w - _PAD_RIGHT}" y1="{y(tick):.1f}" y2="{y(tick):.1f}" stroke="#ddd"/>'
            f'<text x="{_PAD_LEFT - 6}" y="{y(tick) + 4:.1f}" text-anchor="end" fill="#555">{label}</text>'
        )
    out.append(
        f'<text x="{_PAD_LEFT}" y="{h - 6}" fill="#555">{_clock(t0)}</text>'
        f'<text x="{w - _PAD_RIGHT}" y="{h - 6}" text-anchor="end" fill="#555">{_clock(t1)} UTC</text>'
    )
    for i, s in enumerate(series):
        color = PALETTE[i % len(PALETTE)]
        runs: list[list[str]] = [[]]
        for t, v in s.points:
            if v is None or not math.isfinite(v):
                if runs[-1]:
                    runs.append([])
                continue
            runs[-1].append(f"{x(t):.1f},{y(v):.1f}")
        for run in runs:
            if len(run) == 1:
                cx, cy = run[0].split(",")
                out.append(f'<circle cx="{cx}" cy="{cy}" r="2.5" fill="{color}"/>')
            elif run:
                out.append(
                    f'<polyline points="{" ".join(run)}" fill="none" stroke="{color}" stroke-width="2" '
                    f'stroke-linejoin="round"><title>{escape(s.label)}</title></polyline>'
                )
    out.append("</svg>")
    return "".join(out)


def _swatch(i: int) -> str:
    color = PALETTE[i % len(PALETTE)]
    return (
        '<svg class="swatch" width="12" height="12" viewBox="0 0 12 12">'
        f'<rect width="12" height="12" fill="{color}"/></svg>'
    )


def _legend(series: Sequence[Series], latest: Sequence[str]) -> str:
    items = "".join(f"<li>{_swatch(i)} {escape(clip(s.label, 80))}: {latest[i]}</li>" for i, s in enumerate(series))
    return f'<ul class="legend">{items}</ul>'


def _last(s: Series) -> float | None:
    return next((v for _, v in reversed(s.points) if v is not None), None)


def _readiness(data: OverviewData) -> str:
    rows = []
    for c in data.checks:
        state = "ready" if c.ready else "not ready"
        role = "gates readiness" if c.gates else "shown only, does not gate"
        words = CHECK_WORDS.get(c.name, c.name)
        rows.append(
            f'<tr><td>{escape(clip(words, 120))}<div class="muted">{escape(clip(c.name, 60))}</div></td>'
            f'<td class="{"ok" if c.ready else "bad"}">{state}</td><td class="muted">{role}</td>'
            f"<td>{escape(clip(c.detail, 600)) or '—'}</td></tr>"
        )
    verdict = "ready" if data.ready else "not ready"
    head = (
        f'<p>This process is <strong class="{"ok" if data.ready else "bad"}">{verdict}</strong> '
        "(what <code>/readyz</code> answers on the scrape listener).</p>"
    )
    if not rows:
        return head
    return (
        head + "<table><thead><tr><th>check</th><th>state</th><th>role</th><th>in words</th></tr></thead><tbody>"
        f"{''.join(rows)}</tbody></table>"
    )


def _goals(goals: Sequence[Goal]) -> str:
    if not goals:
        return (
            '<p class="muted">No goal yet: goals appear once goal clustering has run on enough ended '
            "conversations (clustering.min_conversations), or clustering is off.</p>"
        )
    rows = "".join(
        f'<tr><td>{escape(clip(g.name or "(no name yet)", 120))}</td><td class="muted">{escape(clip(g.id, 60))}</td>'
        f'<td class="num">{"—" if g.size is None else f"{g.size:.0f}"}</td><td class="num">{g.judged}</td>'
        f'<td class="num">{_pct(g.completion_rate)}</td></tr>'
        for g in goals[:50]
    )
    return (
        "<table><thead><tr><th>goal</th><th>id</th><th>size</th><th>judged</th><th>completion rate</th></tr></thead>"
        f"<tbody>{rows}</tbody></table>"
    )


def _tree_link(e: Escalation, with_tree: set[str]) -> str:
    return f'<a href="trees/{escape(e.id)}">tree</a>' if e.id in with_tree else ""


def _recent(data: OverviewData) -> str:
    if not data.recent:
        return '<p class="muted">No alert since this process started.</p>'
    rows = "".join(
        f"<tr><td>{iso(e.created_at_unix)}</td><td>{escape(e.kind)}</td>"
        f'<td class="sev-{escape(e.severity)}">{escape(e.severity)}</td><td>{escape(clip(e.conversation_id, 60))}</td>'
        f"<td>{escape(clip(e.summary, 200))}</td><td>{_tree_link(e, data.with_tree)}</td></tr>"
        for e in data.recent
    )
    return (
        "<table><thead><tr><th>flagged (UTC)</th><th>kind</th><th>severity</th><th>conversation</th><th>summary</th>"
        f"<th></th></tr></thead><tbody>{rows}</tbody></table>"
        '<p><a href="escalations">all recent escalations</a></p>'
    )


def overview_page(data: OverviewData) -> str:
    """The page ``GET /`` serves."""
    minutes = max(0.0, data.now - data.started) / 60
    body = [
        "<h1>Sidecar overview</h1>",
        '<nav><a href="escalations">escalations</a> · <a href="clusters">goals (JSON)</a></nav>',
        f'<p class="muted">Up {minutes:.0f} min. Plots: the last hour, one point every {data.sample_seconds:g} s, '
        "from this process's own counters (nothing here survives a restart).</p>",
        "<h2>Readiness</h2>",
        _readiness(data),
        "<h2>Completion rate</h2>",
        '<p class="muted">Share of ended conversations judged complete, over the conversations that ended in '
        "the 5 minutes before each point; overall and per goal (the largest goals).</p>",
        line_chart(data.completion, y_max=1.0, title="completion rate over time", percent=True),
        _legend(data.completion, [_pct(_last(s)) for s in data.completion]),
        "<h2>Alerts by kind</h2>",
        '<p class="muted">Alerts decided since the process started, by kind (cumulative).</p>',
        line_chart(data.alerts, y_max=None, title="alerts by kind over time"),
        _legend(data.alerts, [str(data.alert_totals.get(s.label, 0)) for s in data.alerts]),
        "<h2>Latest escalations</h2>",
        _recent(data),
        "<h2>Goals</h2>",
        _goals(data.goals),
    ]
    return document("sidecar overview", body)


__all__ = ["CHECK_WORDS", "Check", "Goal", "OverviewData", "Series", "line_chart", "overview_page"]
