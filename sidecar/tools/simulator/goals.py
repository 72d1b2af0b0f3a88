"""Goal spec files: the hidden goals the simulated users hold.

One JSON object per line (gzip allowed), either

* a goal spec: ``{"goal": str, "goal_id"?: str, "domain"?: str}``, or
* a conversation record of the datasets' schema, whose goal field is taken as the goal:
  OptimouseQuest ``meta.problem_statement``, tau-bench ``meta.user_instruction``, STAR
  ``meta.user_task``, MultiWOZ ``meta.goal_message`` (the crowd worker's sentences, HTML removed).
  A record without one of these (SGD has none) is skipped as ``no_goal``.

The file is read with :mod:`sidecar.transcript.dataset` (its limits policy: lines over 8 MiB and
lines that are not JSON objects are skipped and counted by reason; a file over ``max_file_bytes``,
on disk or once decompressed, is refused). Goals that are empty or longer than the limit, and
repeated goal ids, are skipped and counted by reason too.
"""

from __future__ import annotations

import html
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sidecar.transcript.dataset import ReadLimits, ReadStats, read_objects

_TAG = re.compile(r"<[^>]{0,200}>")
_WS = re.compile(r"\s+")


@dataclass(frozen=True, slots=True)
class GoalSpec:
    """One hidden goal."""

    goal_id: str
    goal: str
    domain: str = ""
    source: str = ""


GoalStats = ReadStats  # goals read (``records``) and lines skipped, by reason


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


def load_goals(
    path: Path, *, max_file_bytes: int, max_goal_chars: int, limit: int | None = None
) -> tuple[list[GoalSpec], GoalStats]:
    """The goals of ``path`` in file order (at most ``limit``); raises :class:`ConfigError` on a bad file."""
    stats = GoalStats()
    limits = ReadLimits(max_total_bytes=max_file_bytes, max_records=limit, flag="--max-file-bytes")
    goals: list[GoalSpec] = []
    seen: set[str] = set()
    for n, record in read_objects(path, stats=stats, limits=limits):
        got = goal_from_record(record, n)
        if isinstance(got, GoalSpec) and len(got.goal) > max_goal_chars:
            got = "goal_too_long"
        elif isinstance(got, GoalSpec) and got.goal_id in seen:
            got = "duplicate_goal_id"
        if isinstance(got, str):
            stats.drop(n, got)
            continue
        seen.add(got.goal_id)
        goals.append(got)
    return goals, stats
