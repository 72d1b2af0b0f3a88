"""What ``sidecar judge`` reads: conversations in the datasets' JSONL schema, as judge examples.

Input: one conversation per line (gzip allowed), ``{"conversation_id": str, "turns" | "messages":
[{"role", "content", "tool_calls"?, "name"?}, ...], "meta"?: {...}}``. A line that is not such an
object (invalid JSON or UTF-8, wrong types, unknown roles, over the size limit) is skipped and
counted by reason, never fatal. A whole file over ``max_file_bytes`` is refused up front.

Only ``turns`` become judge input. Dataset artefacts that give the answer away are stripped as the
adapters' data preparation strips them (tau-bench's ``###STOP###`` user-simulator token), so the
judge and the judge-free rows of a comparison see the same text. Labels, when asked for, come from
``meta`` (``--label-field``) or from the truncation protocol (paper Section 5.2 of the sidecar's
method, as ``adapters eval`` applies it): the full conversation is complete and a copy cut after
turn k, k drawn uniformly from 1..n-1 and seeded by the conversation id, is incomplete.
"""

from __future__ import annotations

import gzip
import json
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Literal, cast

from sidecar.errors import ConfigError
from sidecar.transcript.model import ROLES, Message, ToolCall, count_turns, prefix_through_turn

MAX_LINE_BYTES = 8 * 1024 * 1024
MAX_MESSAGES = 2000
ARTEFACTS: tuple[str, ...] = ("###STOP###",)
Protocol = Literal["none", "truncation"]


@dataclass(frozen=True, slots=True)
class JudgeExample:
    """One conversation (or its truncated copy) to judge, with its known label if any."""

    conversation_id: str
    source: str
    messages: tuple[Message, ...]
    kind: Literal["full", "truncated"] = "full"
    label: bool | None = None


@dataclass(slots=True)
class ReadStats:
    """Lines read and lines skipped, by reason."""

    read: int = 0
    skipped: dict[str, int] = field(default_factory=dict)

    def skip(self, reason: str) -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + 1


class _Skip(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _open(path: Path) -> IO[bytes]:
    if path.suffix == ".gz":
        return cast("IO[bytes]", gzip.open(path, "rb"))
    return path.open("rb")


def check_input(path: Path, max_file_bytes: int) -> None:
    """Refuse a missing, unreadable or oversized file with a clear :class:`ConfigError`."""
    if not path.exists():
        raise ConfigError(f"input file {path} does not exist")
    if not path.is_file():
        raise ConfigError(f"input {path} is not a regular file")
    size = path.stat().st_size
    if size > max_file_bytes:
        raise ConfigError(f"input file {path} is {size} bytes; the limit is {max_file_bytes} (--max-file-bytes)")


def _clean(text: str, role: str) -> str:
    if role != "user" or not any(a in text for a in ARTEFACTS):
        return text
    for artefact in ARTEFACTS:
        text = text.replace(artefact, "")
    return text.strip()


def _message(raw: Any) -> Message | None:
    if not isinstance(raw, dict):
        raise _Skip("bad_message")
    role, content = raw.get("role"), raw.get("content", "")
    if role not in ROLES or not isinstance(content, str):
        raise _Skip("bad_message")
    calls: list[ToolCall] = []
    for c in raw.get("tool_calls") or []:
        if not (isinstance(c, dict) and isinstance(c.get("name"), str)):
            raise _Skip("bad_message")
        args = c.get("arguments", "")
        calls.append(ToolCall(c["name"], args if isinstance(args, str) else json.dumps(args, sort_keys=True)))
    name = raw.get("name")
    text = _clean(content, role)
    if not text and not calls and content:
        return None  # nothing but an artefact was there
    return Message(role=role, content=text, name=name if isinstance(name, str) else None, tool_calls=tuple(calls))


def _record(line: bytes) -> dict[str, Any]:
    if len(line) > MAX_LINE_BYTES:
        raise _Skip("oversized")
    try:
        rec = json.loads(line.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise _Skip("invalid_utf8") from exc
    except (ValueError, RecursionError) as exc:
        raise _Skip("invalid_json") from exc
    if not isinstance(rec, dict) or not isinstance(rec.get("conversation_id"), str):
        raise _Skip("missing_conversation_id")
    return rec


def _messages(rec: dict[str, Any]) -> tuple[Message, ...]:
    raw = rec.get("turns", rec.get("messages"))
    if not isinstance(raw, list) or len(raw) > MAX_MESSAGES:
        raise _Skip("bad_messages")
    msgs = tuple(m for m in (_message(r) for r in raw) if m is not None)
    if count_turns(msgs) == 0:
        raise _Skip("no_user_turn")
    return msgs


def lookup(record: Any, dotted: str) -> Any:
    """``record``'s value at a dotted path (``meta.success``, ``meta.tasks.0``), or None."""
    cur = record
    for part in dotted.split("."):
        if isinstance(cur, dict):
            cur = cur.get(part)
        elif isinstance(cur, list) and part.isdigit() and int(part) < len(cur):
            cur = cur[int(part)]
        else:
            return None
    return cur


def as_label(value: Any) -> bool | None:
    """A completion label from a dataset field: booleans, 0/1 numbers, "true"/"false" strings."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int | float) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in ("true", "false", "yes", "no", "1", "0"):
        return value.strip().lower() in ("true", "yes", "1")
    return None


def truncation_turn(conversation_id: str, n_turns: int, seed: int) -> int | None:
    """k in 1..n-1 (the cut of the incomplete copy), or None when n < 2; stable for a given seed."""
    if n_turns < 2:
        return None
    return random.Random(f"{seed}:{conversation_id}").randint(1, n_turns - 1)


def read_examples(
    path: Path, *, stats: ReadStats, protocol: Protocol = "none", label_field: str | None = None, seed: int = 0
) -> Iterator[JudgeExample]:
    """The judge examples of one file, in file order (with ``truncation``: full, then its copy)."""
    with _open(path) as fh:
        while True:
            line = fh.readline(MAX_LINE_BYTES + 1)
            if not line:
                return
            if len(line) > MAX_LINE_BYTES and not line.endswith(b"\n"):
                while True:  # drain the rest of an oversized line without holding it
                    more = fh.readline(MAX_LINE_BYTES)
                    if not more or more.endswith(b"\n"):
                        break
            if not line.strip():
                continue
            try:
                rec = _record(line)
                msgs = _messages(rec)
            except _Skip as skip:
                stats.skip(skip.reason)
                continue
            stats.read += 1
            cid, source = rec["conversation_id"], str(rec.get("source") or "")
            if protocol == "none":
                yield JudgeExample(cid, source, msgs, label=as_label(lookup(rec, label_field)) if label_field else None)
                continue
            if lookup(rec, "meta.completed") is False:
                # The protocol needs complete conversations as positives: a conversation the dataset
                # itself marks as not completed (STAR disconnects) is left out, as adapters eval does.
                stats.skip("marked_not_completed")
                continue
            yield JudgeExample(cid, source, msgs, "full", True)
            k = truncation_turn(cid, count_turns(msgs), seed)
            if k is not None:
                yield JudgeExample(cid, source, tuple(prefix_through_turn(msgs, k)), "truncated", False)
