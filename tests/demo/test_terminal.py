"""``sidecar demo`` as a person sees it: a real terminal (tmux, 160x48), scoring on, Ctrl-C to stop.

tmux is the terminal emulator: it runs the demo on a pseudo-terminal, so the demo draws its live
panel, and ``capture-pane`` returns the screen as drawn. ``send-keys C-c`` is a real Ctrl-C (the
terminal sends SIGINT to its foreground process group); ``remain-on-exit`` keeps the pane after the
demo exits so its exit status and final summary can be read.

tmux learns how a pane's process ended only when a SIGCHLD makes it call ``waitpid``, and tmux before
3.6 can lose that signal (tmux commit fa5f3cef, GitHub issue 4559): when the pane's terminal closes,
tmux removes the pane's utmp record through libutempter, which sets SIGCHLD to SIG_DFL while its
helper runs. A process that finishes exiting in that window (the demo's last threads take a while
to end after its terminal closes) has its SIGCHLD discarded: the pane reads dead with no status and
no signal, and the process stays an unreaped zombie for as long as tmux runs. tmux 3.6 sends itself
a SIGCHLD after the removal; :meth:`Terminal.exit_status` does the same when a pane stays dead
without a status, and tmux then reports the real outcome (it invents nothing).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

WIDTH, HEIGHT = 160, 48
# vLLM's start on two busy cores (1-2 minutes), then the first verdicts and trees.
SCREEN_TIMEOUT_SECONDS = 420.0
STOP_TIMEOUT_SECONDS = 60.0
# How long a pane may read dead without a status before tmux is asked again (SIGCHLD) to reap it.
REAP_AFTER_SECONDS = 2.0
# The figures the live panel and the final summary both show, by row label.
ROWS = ("events in", "conversations", "turn verdicts", "final verdicts", "trees", "alerts", "goals", "scoring latency")


# How each cumulative row reads as one count.
COUNTS: dict[str, Callable[[str], int]] = {
    "events in": lambda text: numbers(text)[0],
    "turn verdicts": lambda text: sum(numbers(text)),
    "final verdicts": lambda text: sum(numbers(text)[:2]),
    "trees": lambda text: numbers(text)[0],
    "alerts": lambda text: sum(numbers(text)),
}


class Terminal:
    """One tmux server on a private socket, one pane running ``command``."""

    def __init__(self, root: Path, command: list[str]) -> None:
        tmux = shutil.which("tmux")
        assert tmux is not None, "tmux is not installed (`bash .ci/setup` installs it)"
        conf = root / "tmux.conf"
        conf.write_text("set -g remain-on-exit on\nset -g history-limit 20000\n", encoding="utf-8")
        self._base = [tmux, "-S", str(root / "tmux.sock"), "-f", str(conf)]
        self._dead_since: float | None = None
        self._tmux("new-session", "-d", "-s", "demo", "-x", str(WIDTH), "-y", str(HEIGHT), *command)

    def _tmux(self, *args: str) -> str:
        out = subprocess.run([*self._base, *args], capture_output=True, text=True, timeout=30, check=True)
        return out.stdout

    def screen(self, *, history: bool = False) -> str:
        return self._tmux("capture-pane", "-p", "-t", "demo", *(["-S", "-"] if history else []))

    def ctrl_c(self) -> None:
        self._tmux("send-keys", "-t", "demo", "C-c")

    def exit_status(self) -> int | str | None:
        """None while it runs; its exit status once it has exited; ``"signal NAME"`` if a signal
        ended it (tmux then has no status, only ``pane_dead_signal``)."""
        dead, status, sig = (
            self._tmux("display-message", "-p", "-t", "demo", "#{pane_dead}|#{pane_dead_status}|#{pane_dead_signal}")
            .strip()
            .split("|")
        )
        if dead != "1":
            self._dead_since = None
            return None
        if status or sig:
            return int(status) if status else f"signal {sig}"
        # Dead (its terminal closed) but not reaped: tmux has not run waitpid for it yet. Usually a
        # moment; when tmux missed the SIGCHLD (see the module docstring), it never will by itself.
        now = time.monotonic()
        if self._dead_since is None:
            self._dead_since = now
        elif now - self._dead_since >= REAP_AFTER_SECONDS:
            self._dead_since = now
            print("the pane is dead but tmux has not reaped it; SIGCHLD sent to the tmux server")
            os.kill(int(self._tmux("display-message", "-p", "#{pid}").strip()), signal.SIGCHLD)
        return None

    def close(self) -> None:
        subprocess.run([*self._base, "kill-server"], capture_output=True, timeout=30, check=False)


@pytest.fixture
def terminal(tmp_path: Path) -> Iterator[Terminal]:
    command = [sys.executable, "-m", "sidecar", "demo", "--http-port", "0", "--scoring", "on", "--goals", "on"]
    term = Terminal(tmp_path, command)
    try:
        yield term
    finally:
        term.close()


def figure(screen: str, label: str) -> str:
    """The text of the row ``label`` of the figures table (the first such row on ``screen``)."""
    found = re.search(rf"^{label} {{2,}}(.+?)(?: {{2,}}sidecar_\w+)?\s*$", screen, re.MULTILINE)
    assert found is not None, f"no {label!r} row on the screen:\n{screen}"
    return found.group(1).strip()


def numbers(text: str) -> list[int]:
    return [int(n.replace(",", "")) for n in re.findall(r"\d[\d,]*", text)]


def _story_told(screen: str) -> bool:
    try:
        return (
            numbers(figure(screen, "events in"))[0] > 0
            and sum(numbers(figure(screen, "turn verdicts"))) > 0
            and numbers(figure(screen, "trees"))[0] > 0
        )
    except AssertionError:
        return False


def test_the_screen_tells_the_story_and_ctrl_c_leaves_the_same_figures(terminal: Terminal) -> None:
    deadline = time.monotonic() + SCREEN_TIMEOUT_SECONDS
    screen = terminal.screen()
    while not _story_told(screen) and time.monotonic() < deadline:
        assert terminal.exit_status() is None, terminal.screen(history=True)
        time.sleep(2)
        screen = terminal.screen()
    assert _story_told(screen), screen
    live = {row: figure(screen, row) for row in ROWS}
    [port] = set(re.findall(r"http://127\.0\.0\.1:(\d+)/escalations", screen))
    for page in ("escalations", "clusters", "metrics", "readyz"):
        assert f"http://127.0.0.1:{port}/{page}" in screen
    assert re.search(rf"http://127\.0\.0\.1:{port}/\s+the overview", screen), screen
    [log_file] = re.findall(r"^(/\S+sidecar-demo-\d+\.log) ", screen, re.MULTILINE)
    # Logs went to the file named on screen, not through the panel; no progress bar broke it up.
    assert '"event"' not in screen and "it/s]" not in screen and "%|" not in screen
    assert '"event": "sidecar.started"' in Path(log_file).read_text(encoding="utf-8")

    terminal.ctrl_c()
    deadline = time.monotonic() + STOP_TIMEOUT_SECONDS
    while terminal.exit_status() is None and time.monotonic() < deadline:
        time.sleep(0.5)
    everything = terminal.screen(history=True)
    status = terminal.exit_status()
    assert status == 0, (status, everything[-6000:])
    assert "Traceback" not in everything
    summary = everything[everything.index("sidecar demo: final summary") :]
    final = {row: figure(summary, row) for row in ROWS}
    # The same figures: the counts only grew between the live screen read and the stop.
    for row, count in COUNTS.items():
        assert count(final[row]) >= count(live[row]) > (0 if row in ("events in", "turn verdicts", "trees") else -1), (
            row,
            live[row],
            final[row],
        )
    for page in ("escalations", "clusters", "metrics", "readyz"):
        assert f"http://127.0.0.1:{port}/{page}" in summary
    assert re.search(rf"http://127\.0\.0\.1:{port}/\s+the overview", summary), summary
