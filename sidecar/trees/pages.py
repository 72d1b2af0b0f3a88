"""HTML pages of the live view: one response tree, and the list of recent escalations.

Pages hold no script, no inline style (no ``<style>`` element, no ``style=""`` attribute) and no
external resource: the trees are inline SVG and the one stylesheet, :data:`CSS`, is served by the
sidecar itself at ``/pages.css``, so they work under the strict Content-Security-Policy the HTTP
server sends with them (``style-src 'self'``, no ``'unsafe-inline'``). Every value shown goes
through :func:`sidecar.trees.svg.escape`. Links are relative (``trees/<id>`` and ``pages.css`` from
``/escalations``, ``../escalations`` and ``../pages.css`` from a tree), so the pages also work
behind a proxy that serves the sidecar under a path prefix.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime

from sidecar.alerting.alert import Alert, Detail
from sidecar.trees.shape import TreeShape
from sidecar.trees.svg import clip, escape, render_svg

CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:1.5em auto;max-width:1200px;padding:0 1em;color:#222}
h1{font-size:1.35em}h2{font-size:1.1em;margin-top:1.6em}
table{border-collapse:collapse;margin:.6em 0}th,td{border-bottom:1px solid #ddd;padding:.25em .6em;
text-align:left;vertical-align:top}th{background:#f4f4f4}td.num{text-align:right;font-variant-numeric:tabular-nums}
dl{display:grid;grid-template-columns:max-content auto;gap:.15em 1em}dt{color:#555}dd{margin:0}
.muted{color:#777}.sev-critical{color:#b00020;font-weight:600}.sev-warning{color:#b35c00}
pre.text{white-space:pre-wrap;background:#f7f7f7;padding:.6em;border-radius:4px;max-height:20em;overflow:auto}
pre.json{max-height:none}
.scroll{overflow:auto;border:1px solid #eee;max-height:85vh}
nav{margin:.4em 0 1em}.ok{color:#2b8a3e;font-weight:600}.bad{color:#b00020;font-weight:600}
ul.legend{list-style:none;padding:0;margin:.3em 0 1em;display:flex;flex-wrap:wrap;gap:.3em 1.4em}
svg.swatch{vertical-align:-1px}svg.chart{max-width:100%;height:auto}
body.wide{max-width:none}svg.rtree{display:block}
"""
MAX_ROW_TEXT = 300
STYLESHEET = "pages.css"


@dataclass(frozen=True, slots=True)
class Escalation:
    """An alert as the list shows it: ids, numbers, the summary, text only when alerts carry it."""

    id: str
    kind: str
    severity: str
    conversation_id: str
    turn: int
    agent: str
    tenant: str | None
    goal: str | None
    created_at_unix: float
    summary: str
    details: tuple[tuple[str, Detail], ...] = ()
    text: tuple[tuple[str, str], ...] = ()

    @classmethod
    def of(cls, alert: Alert, max_text_chars: int | None) -> Escalation:
        """``alert`` as listed; its text cut to ``max_text_chars``, or dropped when None."""
        return cls(
            id=alert.id,
            kind=alert.kind,
            severity=alert.severity,
            conversation_id=clip(alert.conversation_id, 200),
            turn=alert.turn,
            agent=alert.agent,
            tenant=alert.tenant,
            goal=alert.goal,
            created_at_unix=alert.created_at_unix,
            summary=clip(alert.summary, 500),
            details=tuple((k, v) for k, v in alert.details.items()),
            text=() if max_text_chars is None else tuple((k, clip(v, max_text_chars)) for k, v in alert.text.items()),
        )


@dataclass(frozen=True, slots=True)
class StoredTree:
    """A flagged turn's tree with the alert it belongs to."""

    escalation: Escalation
    shape: TreeShape
    model: str
    budget_hit: str | None
    facts: Mapping[str, Detail] = field(default_factory=dict)


def iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def _value(v: Detail) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return "—" if v is None else str(v)


def document(title: str, body: Iterable[str], *, root: str = "", wide: bool = False) -> str:
    """A complete HTML document around ``body`` (already escaped pieces); ``root`` is the relative
    path from the page to the server's root (``""`` or ``"../"``), where the stylesheet and the
    overview are. ``wide``: the page uses the whole window width (tree pages)."""
    attrs = ' class="wide"' if wide else ""
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width,initial-scale=1">'
        f'<title>{escape(title)}</title><link rel="stylesheet" href="{escape(root + STYLESHEET)}">'
        f"</head><body{attrs}>{''.join(body)}</body></html>"
    )


def nav(root: str = "") -> str:
    """The links every page starts with: the overview at ``/`` and the escalations list."""
    home, listing = escape(root or "./"), escape(root + "escalations")
    return f'<nav><a href="{home}">overview</a> · <a href="{listing}">escalations</a></nav>'


def _facts(pairs: Iterable[tuple[str, Detail]]) -> str:
    rows = "".join(f"<dt>{escape(k)}</dt><dd>{escape(_value(v))}</dd>" for k, v in pairs)
    return f"<dl>{rows}</dl>"


LEGEND = (
    "Left to right: the response as the model would write it, one lane per branch. Stroke width and "
    "opacity: the probability mass (exp of the path logprob) of the leaves below that stretch. Orange: "
    "the most probable branch and its path. Filled circle: the branch reached an end of response; "
    "hollow: cut at the depth or compute limit. Hover a branch for its numbers"
)


def tree_page(tree: StoredTree) -> str:
    """The page ``GET /trees/{id}`` serves."""
    e = tree.escalation
    shape = tree.shape
    legend = LEGEND + (" and its text." if shape.has_text else "; text is not kept (alerting.include_text is off).")
    facts: list[tuple[str, Detail]] = [
        ("alert", e.id),
        ("kind", e.kind),
        ("severity", e.severity),
        ("conversation", e.conversation_id),
        ("turn", e.turn),
        ("agent", e.agent),
        ("tenant", e.tenant),
        ("goal", e.goal),
        ("flagged at", iso(e.created_at_unix)),
        ("model", tree.model),
        ("budget hit", tree.budget_hit),
        *tree.facts.items(),
    ]
    body = [
        nav("../"),
        f"<h1>Response tree: {escape(e.summary)}</h1>",
        _facts(facts),
    ]
    best = shape.best()
    if best is not None and shape.has_text:
        body.append(f'<h2>Most probable branch</h2><pre class="text">{escape(shape.full_text(best) or "")}</pre>')
    body += [
        f'<h2>Tree ({shape.leaves} leaves)</h2><p class="muted">{escape(legend)}</p>',
        f'<div class="scroll">{render_svg(shape, title=f"response tree of alert {e.id}")}</div>',
    ]
    return document(f"response tree {e.id}", body, root="../", wide=True)


def escalations_page(items: Iterable[Escalation], with_tree: set[str], capacity: int) -> str:
    """The page ``GET /escalations`` serves: newest first."""
    rows = []
    for e in items:
        link = f'<a href="trees/{escape(e.id)}">tree</a>' if e.id in with_tree else ""
        details = ", ".join(f"{escape(k)}={escape(_value(v))}" for k, v in e.details)
        text = "".join(f'<div class="muted">{escape(k)}: {escape(clip(v, MAX_ROW_TEXT))}</div>' for k, v in e.text)
        rows.append(
            f"<tr><td>{iso(e.created_at_unix)}</td><td>{escape(e.kind)}</td>"
            f'<td class="sev-{escape(e.severity)}">{escape(e.severity)}</td><td>{escape(e.agent)}</td>'
            f'<td>{escape(clip(e.conversation_id, 60))}</td><td class="num">{e.turn}</td>'
            f'<td>{escape(e.summary)}{text}<div class="muted">{details}</div></td><td>{link}</td></tr>'
        )
    table = (
        "<table><thead><tr><th>flagged (UTC)</th><th>kind</th><th>severity</th><th>agent</th><th>conversation</th>"
        "<th>turn</th><th>verdict</th><th></th></tr></thead><tbody>" + "".join(rows) + "</tbody></table>"
        if rows
        else "<p>No escalation since this process started.</p>"
    )
    body = [
        nav(),
        "<h1>Recent escalations</h1>",
        f'<p class="muted">The last {capacity} alerts this replica decided, newest first; trees of the most '
        "recent uncertain turns are linked while they are kept in memory.</p>",
        table,
    ]
    return document("recent escalations", body)


def json_page(name: str, text: str) -> str:
    """A JSON route's answer for a browser: the same JSON, indented, as text in a page that links
    back to the overview (what ``GET /clusters`` shows when the client asks for HTML)."""
    with contextlib.suppress(ValueError):  # not JSON: shown as it came
        text = json.dumps(json.loads(text), indent=2, ensure_ascii=False)
    body = [
        nav(),
        f"<h1>/{escape(name)}</h1>",
        '<p class="muted">The JSON this route answers to tools (any client that does not ask for HTML).</p>',
        f'<pre class="text json">{escape(text)}</pre>',
    ]
    return document(f"/{name}", body)


def message_page(title: str, message: str) -> str:
    """A small page for 400/404 answers under ``/trees/``."""
    return document(
        title,
        [nav("../"), f"<h1>{escape(title)}</h1><p>{escape(message)}</p>"],
        root="../",
    )
