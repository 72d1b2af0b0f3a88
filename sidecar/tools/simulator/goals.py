"""Goal spec files: the hidden goals the simulated users hold.

One JSON object per line (gzip allowed), either

* a goal spec: ``{"goal": str, "goal_id"?: str, "domain"?: str}``, or
* a conversation record of the datasets' schema, whose goal field is taken as the goal:
  OptimouseQuest ``meta.problem_statement``, tau-bench ``meta.user_instruction``, STAR
  ``meta.user_task``, MultiWOZ ``meta.goal_message`` (the crowd worker's sentences, HTML removed).
  A record without one of these (SGD has none) is skipped as ``no_goal``.

Lines that are not JSON objects, goals that are empty or longer than the limit, and repeated goal
ids are skipped and counted by reason; a file over ``max_file_bytes`` is refused up front.
"""

from __future__ import annotations

import gzip
import html
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, cast

from sidecar.errors import ConfigError

MAX_LINE_BYTES = 4 * 1024 * 1024
_TAG = re.compile(r"<[^>]{0,200}>")
_WS = re.compile(r"\s+")


@dataclass(frozen=True, slots=True)
class GoalSpec:
    """One hidden goal."""

    goal_id: str
    goal: str
    domain: str = ""
    source: str = ""


@dataclass(slots=True)
class GoalStats:
    """Goals read and lines skipped, by reason."""

    read: int = 0
    skipped: dict[str, int] = field(default_factory=dict)

    def skip(self, reason: str) -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + 1


def _text(value: Any) -> str:
    return _WS.sub(" ", value).strip() if isinstance(value, str) else ""


def dataset_goal(record: dict[str, Any]) -> str:
    """The natural-language goal a dataset record carries, or "" when it has none."""
    meta = record.get("meta")
    if not isinstance(meta, dict):
        return ""
    for key in ("problem_statement", "user_instruction", "user_task"):
        text = _text(meta.get(key))
        if text:
            return text
    sentences = meta.get("goal_message")
    if isinstance(sentences, list):
        parts = [_text(html.unescape(_TAG.sub("", s))) for s in sentences if isinstance(s, str)]
        return " ".join(p if p.endswith((".", "?", "!")) else p + "." for p in parts if p)
    return ""


def goal_from_record(record: Any, line_no: int) -> GoalSpec | str:
    """The goal of one parsed line, or the reason it is skipped."""
    if not isinstance(record, dict):
        return "not_an_object"
    if "goal" in record:
        goal = _text(record["goal"])
        gid = record.get("goal_id", f"line-{line_no}")
        if not isinstance(gid, str | int) or isinstance(gid, bool):
            return "bad_goal_id"
        domain = record.get("domain", "")
        return GoalSpec(str(gid), goal, domain if isinstance(domain, str) else "") if goal else "no_goal"
    cid = record.get("conversation_id")
    if not isinstance(cid, str):
        return "no_goal"
    goal = dataset_goal(record)
    if not goal:
        return "no_goal"
    domain, source = record.get("domain", ""), record.get("source", "")
    return GoalSpec(cid, goal, domain if isinstance(domain, str) else "", source if isinstance(source, str) else "")


def _open(path: Path) -> IO[bytes]:
    return cast("IO[bytes]", gzip.open(path, "rb")) if path.suffix == ".gz" else path.open("rb")


def _read(fh: IO[bytes], path: Path, max_goal_chars: int, limit: int | None) -> tuple[list[GoalSpec], GoalStats]:
    stats = GoalStats()
    goals: list[GoalSpec] = []
    seen: set[str] = set()
    for n, line in enumerate(iter(lambda: fh.readline(MAX_LINE_BYTES + 1), b""), start=1):
        if limit is not None and len(goals) >= limit:
            break
        if not line.strip():
            continue
        if len(line) > MAX_LINE_BYTES:
            raise ConfigError(f"{path} line {n}: longer than {MAX_LINE_BYTES} bytes")
        try:
            got = goal_from_record(json.loads(line.decode("utf-8")), n)
        except (UnicodeDecodeError, ValueError, RecursionError):
            got = "invalid_json"
        if isinstance(got, GoalSpec) and len(got.goal) > max_goal_chars:
            got = "goal_too_long"
        elif isinstance(got, GoalSpec) and got.goal_id in seen:
            got = "duplicate_goal_id"
        if isinstance(got, str):
            stats.skip(got)
            continue
        seen.add(got.goal_id)
        goals.append(got)
        stats.read += 1
    return goals, stats


def load_goals(
    path: Path, *, max_file_bytes: int, max_goal_chars: int, limit: int | None = None
) -> tuple[list[GoalSpec], GoalStats]:
    """The goals of ``path`` in file order (at most ``limit``); raises :class:`ConfigError` on a bad file."""
    if not path.exists():
        raise ConfigError(f"goals file {path} does not exist")
    if not path.is_file():
        raise ConfigError(f"goals file {path} is not a regular file")
    size = path.stat().st_size
    if size > max_file_bytes:
        raise ConfigError(f"goals file {path} is {size} bytes; the limit is {max_file_bytes} (--max-file-bytes)")
    try:
        with _open(path) as fh:
            return _read(fh, path, max_goal_chars, limit)
    except (OSError, EOFError) as exc:  # gzip.BadGzipFile is an OSError
        raise ConfigError(f"goals file {path} cannot be read: {exc}") from exc
