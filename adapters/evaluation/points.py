"""The resumable results file of the long evaluations (``curve.json``, ``lodo.json``).

A run writes the file after every point, so a stopped run resumes where it was. Each write goes to a
temporary file that then replaces the old one: an interrupted write leaves the previous complete
file, never half of one. A file that is not such a document (damaged, or someone else's) is a
clear error rather than hours of work silently thrown away.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from adapters.errors import DataError
from adapters.serving.manifest import recorded_command


def open_points(path: Path, prog: str, argv: list[str] | None = None) -> dict[str, Any]:
    """The document at ``path`` (a new one if there is none), with this run's command recorded."""
    doc: dict[str, Any] = {"points": {}}
    if path.exists():
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, ValueError) as exc:
            raise DataError(
                f"{path} is not a results file this tool wrote ({exc}); move it away to start over"
            ) from exc
        if not isinstance(doc, dict) or not isinstance(doc.get("points"), dict):
            raise DataError(f"{path} holds no 'points' map; move it away to start over")
    doc["command"] = recorded_command(prog, argv)
    return doc


def save_points(path: Path, doc: dict[str, Any]) -> None:
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    partial.replace(path)
