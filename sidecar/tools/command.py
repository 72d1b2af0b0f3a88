"""How a report records the command that made it."""

from __future__ import annotations

import shlex
import sys
from collections.abc import Sequence
from pathlib import Path


def recorded_command(prog: str, argv: Sequence[str] | None = None) -> str:
    """``prog`` and this run's arguments (default ``sys.argv[1:]``) as a report records them: shell-quoted,
    the home directory written ``~``, so a committed report names no path of the machine it ran on."""
    home = str(Path.home()).rstrip("/")
    args = sys.argv[1:] if argv is None else argv
    quoted = [shlex.quote(a) for a in args]
    if home:  # a home of "/" (some containers) would turn every path into "~"
        quoted = [q.replace(home + "/", "~/") for q in quoted]
    return " ".join([prog, *quoted])
