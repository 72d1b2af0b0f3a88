"""What ``sidecar demo`` shows while it runs, and the summary it leaves when it stops.

The figures are read by name from the sidecar's registry (:mod:`sidecar.tools.demo.figures`):
events in and lag, conversations, completion verdicts, trees and uncertain turns, alerts by kind
and sink, goals with their completion rate, scoring latency. Below them: the last few alerts with
their conversation and a link, and the pages to open.

On a terminal: a live panel (rich) refreshed a few times a second; the final summary replaces it
on stop. Elsewhere (CI logs, a pipe): one plain status line every few seconds, so the output stays
readable as a log, and the same final summary.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Final, TextIO

from prometheus_client import CollectorRegistry
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from sidecar.tools.demo.alert_feed import AlertFeed
from sidecar.tools.demo.figures import Figures, read_figures

PLAIN_INTERVAL_SECONDS: Final = 5.0
# The measured rate is trusted for the time-left estimate after this long; before, the target rate.
RATE_SETTLE_SECONDS: Final = 5.0
MAX_GOAL_ROWS: Final = 8
# The pages of the operator listener the screen names (the listener serves them; see docs/demo.md).
PAGES: Final = (
    ("", "the overview: completion rate, alerts by kind, latest escalations, goals, readiness"),
    ("escalations", "recent alerts; an uncertain turn's response tree at /trees/<alert id>"),
    ("clusters", "goal clusters, their names, sizes and completion rates"),
    ("metrics", "every figure above, for Prometheus"),
    ("readyz", "readiness, each check in words"),
)
# Narrower than this, the alerts are listed on two lines each instead of in a table.
MIN_SUMMARY_CHARS: Final = 16
# The characters a 4-column boxed table spends on its rules and padding: 5 rules, 2 spaces a column.
_TABLE_RULES: Final = 13
# Below this width the column naming each figure's metric is left out.
METRIC_COLUMN_MIN_WIDTH: Final = 120


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _seconds(value: float) -> str:
    return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.1f} s"


def _percent(rate: float | None) -> str:
    return "-" if rate is None else f"{rate:.0%}"


def figure_rows(f: Figures) -> list[tuple[str, str, str]]:
    """(what, figure, metric it comes from): the rows of the figures table, in story order."""
    alerts = ", ".join(f"{kind} → {sink} {n}" for (kind, sink), n in sorted(f.alerts_delivered.items())) or "0"
    if f.alerts_rejected:
        alerts += f" ({sum(f.alerts_rejected.values())} rejected by sinks)"
    latency = "; ".join(f"{x.kind} p50 {_seconds(x.p50_seconds)} p95 {_seconds(x.p95_seconds)}" for x in f.latency)
    judged = f.final_complete + f.final_incomplete
    rate = _percent(f.final_complete / judged if judged else None)
    named = len(f.named_goals)
    return [
        ("events in", f"{f.events_in:,}  (lag {f.lag_records:,})", "sidecar_events_consumed_total"),
        (
            "conversations",
            f"{f.conversations_open:,} open, {f.conversations_ended:,} ended",
            "sidecar_conversations_active",
        ),
        (
            "turn verdicts",
            f"{f.turns_complete:,} complete, {f.turns_incomplete:,} incomplete",
            "sidecar_completion_scored_total",
        ),
        (
            "final verdicts",
            f"{f.final_complete:,} complete, {f.final_incomplete:,} incomplete ({rate} complete)",
            "sidecar_conversations_ended_total",
        ),
        ("trees", f"{f.trees:,}  ({f.uncertain_turns:,} uncertain turns)", "sidecar_tree_leaves"),
        ("alerts", alerts, "sidecar_alerts_total"),
        ("goals", f"{named} named of {f.clusters} clusters", "sidecar_goal_info"),
        ("scoring latency", latency or "-", "sidecar_scoring_duration_seconds"),
    ]


class DemoDisplay:
    """Counts produced events; renders progress, the figures, recent alerts and the pages."""

    def __init__(
        self,
        registry: CollectorRegistry,
        *,
        total: int | None,
        pages_url: str,
        rate: float | None = None,
        alerts: AlertFeed | None = None,
        log_path: str | None = None,
        stream: TextIO | None = None,
        width: int | None = None,
        started: float | None = None,
    ) -> None:
        self._registry = registry
        self._total = total
        self._pages_url = pages_url.rstrip("/")
        self._rate = rate
        self._alerts = alerts
        self._log_path = log_path
        self._console = Console(file=stream, width=width, highlight=False)
        self._live: Live | None = None
        self._produced = 0
        self._started = time.monotonic() if started is None else started
        self._t0 = time.monotonic()
        self._last_plain = 0.0
        self._stopped = False
        self.first_goal_after: float | None = None
        self.on_first_goal: Callable[[float], None] | None = None

    @property
    def console(self) -> Console:
        return self._console

    @property
    def produced(self) -> int:
        return self._produced

    @property
    def live(self) -> bool:
        return self._live is not None

    def __enter__(self) -> DemoDisplay:
        self._t0 = time.monotonic()
        if self._console.is_terminal:
            self._live = Live(
                get_renderable=self._render,
                console=self._console,
                refresh_per_second=4,
                transient=True,  # the final summary takes its place
                redirect_stdout=True,
                redirect_stderr=True,
            )
            self._live.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None

    def progress(self, produced: int) -> None:
        """Producer callback: ``produced`` events handed to Kafka so far."""
        if self._produced == 0:
            # The rate counts from the first event, not from the start-up; so does the status line.
            self._t0 = self._last_plain = time.monotonic()
        self._produced = produced
        if self._live is None:
            now = time.monotonic()
            if now - self._last_plain >= PLAIN_INTERVAL_SECONDS:
                self._last_plain = now
                figures = read_figures(self._registry)
                self._watch_goals(figures.named_goals)
                self._console.print(self._plain_line(figures), soft_wrap=True)

    def final(self) -> None:
        """The final summary: the same figures, the recent alerts and the pages, printed to stay."""
        if self._live is not None:
            self._live.stop()
            self._live = None
        self._stopped = True
        self._console.print(self._panel(read_figures(self._registry), title="sidecar demo: final summary"))

    def note(self, text: str) -> None:
        self._console.print(Text(text), soft_wrap=True)

    # -- rendering ----------------------------------------------------------------------------

    def status_line(self) -> str:
        """``produced 673/5960 events (4/s), ~22 min left``."""
        elapsed = time.monotonic() - self._t0
        of = f"/{self._total}" if self._total is not None else ""
        # A rate over the first instants is noise (one event in a microsecond); show it after 1 s.
        measured = self._produced / elapsed if elapsed >= 1.0 and self._produced else None
        rate = f" ({measured:.0f}/s)" if measured is not None else ""
        line = f"produced {self._produced:,}{of} events{rate}"
        if self._total is not None and self._produced >= self._total:
            return line + ", all sent"
        if self._stopped:
            return line
        speed = measured if measured is not None and elapsed >= RATE_SETTLE_SECONDS else self._rate
        if self._total is not None and speed:
            line += f", ~{_duration((self._total - self._produced) / speed)} left"
        return line

    def _plain_line(self, f: Figures) -> str:
        judged = f.final_complete + f.final_incomplete
        return (
            f"{self.status_line()}; in {f.events_in:,} (lag {f.lag_records:,}); "
            f"{f.conversations_ended:,} ended ({f.final_complete:,} complete, {f.final_incomplete:,} incomplete"
            f"{', ' + _percent(f.final_complete / judged) if judged else ''}); "
            f"{f.trees:,} trees, {f.uncertain_turns:,} uncertain; {f.alerts:,} alerts; "
            f"{len(f.named_goals)} goals"
        )

    def _figures_table(self, f: Figures) -> Table:
        table = Table(show_header=False, box=None, pad_edge=False, padding=(0, 2, 0, 0))
        table.add_column("what", style="bold", no_wrap=True)
        table.add_column("figure")
        wide = self._console.width >= METRIC_COLUMN_MIN_WIDTH
        if wide:
            table.add_column("metric", style="dim", no_wrap=True)
        for what, figure, metric in figure_rows(f):
            table.add_row(what, figure, *([metric] if wide else []))
        return table

    def _goals_table(self, f: Figures) -> Table | None:
        if not f.goals:
            return None
        table = Table(title="goals", title_justify="left")
        table.add_column("goal")
        table.add_column("id", style="dim")
        table.add_column("conversations", justify="right")
        table.add_column("ended complete", justify="right")
        shown = f.named_goals or f.goals
        for g in shown[:MAX_GOAL_ROWS]:
            table.add_row(Text(g.name), Text(g.goal), f"{g.conversations:,}", _percent(g.completion_rate))
        if len(shown) > MAX_GOAL_ROWS:
            table.add_row(Text(f"... {len(shown) - MAX_GOAL_ROWS} more at {self._pages_url}/clusters"), "", "", "")
        return table

    def _alerts_table(self) -> RenderableType | None:
        if self._alerts is None or not self._alerts.recent():
            return None
        title = f"last alerts ({self._alerts.read:,} read from the alert topic)"
        recent = self._alerts.recent()
        # The kind and the link are shown whole (a link cut short opens nothing); the conversation
        # id is cut at 28 characters and the summary takes what is left of the line, on one line.
        kind, link = max(len(a.kind) for a in recent), max(len(a.link) for a in recent)
        conversation = min(28, max(len("conversation"), *(len(a.conversation_id) for a in recent)))
        summary = self._console.width - kind - conversation - link - _TABLE_RULES
        if summary < MIN_SUMMARY_CHARS:  # a narrow terminal: each alert on two lines, the link whole
            lines = [Text(title)]
            for a in recent:
                lines.append(Text(f"  {a.kind}  {a.conversation_id}  {a.summary}", no_wrap=True, overflow="ellipsis"))
                lines.append(Text(f"    {a.link}", style="link " + a.link))
            return Group(*lines)
        table = Table(title=title, title_justify="left")
        table.add_column("kind", no_wrap=True, min_width=kind)
        table.add_column("conversation", no_wrap=True, overflow="ellipsis", max_width=conversation)
        table.add_column("summary", no_wrap=True, overflow="ellipsis", max_width=summary)
        table.add_column("open", no_wrap=True, min_width=link)
        for a in recent:
            table.add_row(Text(a.kind), Text(a.conversation_id), Text(a.summary), Text(a.link, style="link " + a.link))
        return table

    def _pages(self) -> Table:
        table = Table(show_header=False, box=None, pad_edge=False, padding=(0, 2, 0, 0))
        table.add_column("page", no_wrap=True)
        table.add_column("what", style="dim")
        for page, what in PAGES:
            url = f"{self._pages_url}/{page}"
            table.add_row(Text(url, style="link " + url), what)
        if self._log_path is not None:
            table.add_row(Text(self._log_path), "the sidecar's logs")
        return table

    def _panel(self, f: Figures, *, title: str) -> Group:
        parts: list[RenderableType] = [Text(title, style="bold"), Text(self.status_line()), self._figures_table(f)]
        goals, alerts = self._goals_table(f), self._alerts_table()
        parts.extend(x for x in (goals, alerts) if x is not None)
        parts.append(self._pages())
        return Group(*parts)

    def _render(self) -> Group:
        f = read_figures(self._registry)
        self._watch_goals(f.named_goals)
        title = "sidecar demo" + (f" (first goal after {self.first_goal_after:.0f} s)" if self.first_goal_after else "")
        return self._panel(f, title=title + ": Ctrl-C to stop")

    def _watch_goals(self, named: Sequence[object]) -> None:
        if named and self.first_goal_after is None:
            self.first_goal_after = time.monotonic() - self._started
            if self.on_first_goal is not None:
                self.on_first_goal(self.first_goal_after)


__all__ = ["DemoDisplay", "figure_rows"]
