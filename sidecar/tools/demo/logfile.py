"""Where the demo's logs go on a terminal: a file named on screen, warnings echoed below the panel.

The sidecar logs a few dozen info lines while it starts and runs (capability probe, recovery,
self-tests, page views): on a terminal they would scroll through the live panel. :class:`LogFile`
is the stream :func:`sidecar.telemetry.logging.configure_logging` writes to instead: every line
goes to the file (JSON, as the logging set-up writes to anything that is not a terminal), and a
line at warning level or above is also handed to ``echo`` as a short ``level event`` text.

:func:`quiet_progress_bars` sets the environment that silences third-party progress bars (tqdm in
sentence-transformers and the Hugging Face hub) before those libraries are imported.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Final, TextIO

ECHOED_LEVELS: Final = frozenset({"warning", "error", "critical", "exception"})
# An echoed line shows its event name and at most this many characters of its fields.
MAX_ECHO_CHARS: Final = 200
# A line still being written is kept up to this long for the level check (log lines are far shorter).
MAX_PARTIAL_CHARS: Final = 1_000_000
PROGRESS_BAR_ENVIRONMENT: Final = {
    "TQDM_DISABLE": "1",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1",
    "TRANSFORMERS_VERBOSITY": "error",
}


def quiet_progress_bars() -> None:
    """Silence tqdm and Hugging Face progress bars in this process (a value set already is kept)."""
    for name, value in PROGRESS_BAR_ENVIRONMENT.items():
        os.environ.setdefault(name, value)


def echo_text(line: str) -> str | None:
    """The short text to echo for one JSON log line, None when it is below warning (or not JSON)."""
    try:
        record = json.loads(line)
    except ValueError:
        return None
    if not isinstance(record, dict) or str(record.get("level", "")).lower() not in ECHOED_LEVELS:
        return None
    fields = " ".join(f"{k}={v}" for k, v in record.items() if k not in ("timestamp", "level", "event"))
    return f"{record['level']}: {record.get('event', '?')} {fields}"[:MAX_ECHO_CHARS].rstrip()


class LogFile:
    """A text stream writing to ``path`` (line-buffered), echoing warning lines to ``echo``."""

    def __init__(self, path: Path, echo: Callable[[str], None]) -> None:
        self.path = path
        self._file: TextIO = path.open("a", encoding="utf-8", buffering=1)
        self.echo = echo  # replaceable: the live panel takes over once it is up
        self._partial = ""

    def write(self, text: str) -> int:
        n = self._file.write(text)
        lines = (self._partial + text).split("\n")
        self._partial = lines.pop()[-MAX_PARTIAL_CHARS:]
        for line in lines:
            shown = echo_text(line)
            if shown is not None:
                self.echo(shown)
        return n

    def flush(self) -> None:
        self._file.flush()

    def isatty(self) -> bool:
        return False

    def close(self) -> None:
        self._file.close()


__all__ = ["LogFile", "echo_text", "quiet_progress_bars"]
