"""What ``sidecar demo`` shows while it runs: replay progress and the sidecar's own counters.

On a terminal: a live panel (rich) refreshed a few times a second. Elsewhere (CI logs, a pipe):
one plain status line every few seconds, so the output stays readable as a log.
"""

from __future__ import annotations

import time
from typing import Final, TextIO

from prometheus_client import CollectorRegistry
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

PLAIN_INTERVAL_SECONDS: Final = 5.0
MAX_ROWS: Final = 16


def metric_summary(registry: CollectorRegistry) -> list[tuple[str, float]]:
    """``sidecar_*`` counters and gauges, each summed over its labels, sorted by name."""
    rows: list[tuple[str, float]] = []
    for family in registry.collect():
        if not family.name.startswith("sidecar_") or family.type not in ("counter", "gauge"):
            continue
        suffix = "_total" if family.type == "counter" else ""
        name = family.name + suffix
        total = sum(s.value for s in family.samples if s.name == name)
        rows.append((name, total))
    return sorted(rows)


class DemoDisplay:
    """Counts produced events; renders progress plus the registry's counters."""

    def __init__(
        self, registry: CollectorRegistry, *, total: int | None, metrics_url: str, stream: TextIO | None = None
    ) -> None:
        self._registry = registry
        self._total = total
        self._metrics_url = metrics_url
        self._console = Console(file=stream, highlight=False)
        self._live: Live | None = None
        self._produced = 0
        self._t0 = time.monotonic()
        self._last_plain = 0.0

    @property
    def console(self) -> Console:
        return self._console

    @property
    def produced(self) -> int:
        return self._produced

    def __enter__(self) -> DemoDisplay:
        self._t0 = time.monotonic()
        if self._console.is_terminal:
            self._live = Live(
                get_renderable=self._render,
                console=self._console,
                refresh_per_second=4,
                transient=False,
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
                self._console.print(self._status_line(), soft_wrap=True)

    def final(self) -> None:
        """Show the final counters (on a terminal the live panel's last frame already does)."""
        if self._live is None:
            self._console.print(self.summary_table())

    def note(self, text: str) -> None:
        self._console.print(text, soft_wrap=True)

    def _status_line(self) -> str:
        elapsed = time.monotonic() - self._t0
        of = f"/{self._total}" if self._total is not None else ""
        # A rate over the first instants is noise (one event in a microsecond); show it after 1 s.
        rate = f" ({self._produced / elapsed:.0f}/s)" if elapsed >= 1.0 else ""
        return f"produced {self._produced}{of} events{rate}"

    def summary_table(self) -> Table:
        table = Table(title=f"sidecar metrics ({self._metrics_url})", title_justify="left")
        table.add_column("metric")
        table.add_column("value", justify="right")
        for name, value in metric_summary(self._registry)[:MAX_ROWS]:
            table.add_row(name, f"{value:,.0f}" if value == int(value) else f"{value:,.3f}")
        return table

    def _render(self) -> Group:
        return Group(Text(self._status_line()), self.summary_table())


__all__ = ["DemoDisplay", "metric_summary"]
