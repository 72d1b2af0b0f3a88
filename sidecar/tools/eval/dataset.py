"""The evaluation input: a JSONL(.gz) file of conversations in the shared dataset schema.

One conversation per line: ``{"conversation_id": str, "turns" | "messages": [{"role", "content",
"tool_calls"?, "name"?}], "source"?: str, "domain"?: str, "meta"?: {...}}``. Only the messages are
scored. ``source`` groups the report's rows; a few ``meta`` fields, when present, are outcome
labels the report can hold the scores against (never shown to a model): ``completed`` and
``completion_level`` (STAR), ``user_reported_task_success`` (STAR), ``reward`` and ``success``
(tau-bench).

Errors are explicit. A missing, empty or oversized file (on disk, or once decompressed: a gzip
bomb stops at the limit) is a :class:`~sidecar.errors.ConfigError`. A malformed line (invalid
UTF-8 or JSON, not an object, no id, bad messages, a duplicate id, no user message, over the line
limit) is skipped and counted with its line number, or, with ``strict``, is the error.
"""

from __future__ import annotations

import gzip
import json
import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, cast

from sidecar.errors import ConfigError
from sidecar.transcript.model import ROLES, Message, ToolCall, count_turns

MAX_LINE_BYTES = 4 * 1024 * 1024
MAX_MESSAGES = 2000
MAX_ID_CHARS = 512
LABEL_FIELDS = ("completed", "completion_level", "user_reported_task_success", "reward", "success")
_SHOWN_PROBLEMS = 5


@dataclass(frozen=True, slots=True)
class EvalConversation:
    conversation_id: str
    messages: tuple[Message, ...]
    source: str
    domain: str
    labels: Mapping[str, Any] = field(default_factory=dict)

    @property
    def turns(self) -> int:
        return count_turns(self.messages)


@dataclass(slots=True)
class ReadReport:
    """What reading found: conversations kept, lines skipped by reason, the first few problems."""

    read: int = 0
    skipped: dict[str, int] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    def skip(self, line_no: int, reason: str) -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + 1
        if len(self.problems) < _SHOWN_PROBLEMS:
            self.problems.append(f"line {line_no}: {reason.replace('_', ' ')}")

    def describe(self) -> str:
        if not self.skipped:
            return f"{self.read} conversations"
        counts = ", ".join(f"{k} {v}" for k, v in sorted(self.skipped.items()))
        return f"{self.read} conversations, {sum(self.skipped.values())} lines skipped ({counts})"


class _Bad(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _message(raw: Any) -> Message:
    if not isinstance(raw, dict):
        raise _Bad("bad_message")
    role, content = raw.get("role"), raw.get("content", "")
    if role not in ROLES or not isinstance(content, str):
        raise _Bad("bad_message")
    calls = []
    for c in raw.get("tool_calls") or []:
        if not isinstance(c, dict) or not isinstance(c.get("name"), str):
            raise _Bad("bad_message")
        args = c.get("arguments", "")
        calls.append(ToolCall(c["name"], args if isinstance(args, str) else json.dumps(args, sort_keys=True)))
    name = raw.get("name")
    return Message(role, content, name if isinstance(name, str) else None, tuple(calls))


def _labels(meta: Any) -> dict[str, Any]:
    if not isinstance(meta, dict):
        return {}
    out: dict[str, Any] = {}
    for key in LABEL_FIELDS:
        value = meta.get(key)
        if isinstance(value, bool | str) or (isinstance(value, int | float) and not isinstance(value, bool)):
            out[key] = value if not isinstance(value, str) else value[:64]
    return out


def parse_record(line: bytes) -> EvalConversation:
    """One line as a conversation; raises ``_Bad`` with the reason."""
    if len(line) > MAX_LINE_BYTES:
        raise _Bad("oversized_line")
    try:
        rec = json.loads(line.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise _Bad("invalid_utf8") from exc
    except (ValueError, RecursionError) as exc:
        raise _Bad("invalid_json") from exc
    if not isinstance(rec, dict):
        raise _Bad("not_an_object")
    cid = rec.get("conversation_id")
    if not isinstance(cid, str) or not cid or len(cid) > MAX_ID_CHARS:
        raise _Bad("bad_conversation_id")
    raw = rec.get("turns", rec.get("messages"))
    if not isinstance(raw, list) or len(raw) > MAX_MESSAGES:
        raise _Bad("bad_messages")
    messages = tuple(_message(m) for m in raw)
    if count_turns(messages) == 0:
        raise _Bad("no_user_message")
    source, domain = rec.get("source"), rec.get("domain")
    return EvalConversation(
        cid,
        messages,
        source[:64] if isinstance(source, str) and source else "unknown",
        domain[:64] if isinstance(domain, str) else "",
        _labels(rec.get("meta")),
    )


class _Limited:
    """Counts the (decompressed) bytes read and stops past ``limit``."""

    def __init__(self, fh: IO[bytes], limit: int, path: Path) -> None:
        self._fh, self._limit, self._path, self.total = fh, limit, path, 0

    def readline(self, size: int) -> bytes:
        line = self._fh.readline(size)
        self.total += len(line)
        if self.total > self._limit:
            raise ConfigError(f"{self._path}: more than {self._limit} bytes of data (--max-input-bytes)")
        return line


def _open(path: Path) -> IO[bytes]:
    if path.suffix == ".gz":
        return cast("IO[bytes]", gzip.open(path, "rb"))
    return path.open("rb")


def _lines(path: Path, max_bytes: int) -> Iterator[tuple[int, bytes | None]]:
    """(line number, bytes) for every line; None for a line over the line limit (drained unread)."""
    try:
        fh = _open(path)
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror or exc}") from exc
    with fh:
        src = _Limited(fh, max_bytes, path)
        number = 0
        try:
            while line := src.readline(MAX_LINE_BYTES + 1):
                number += 1
                if len(line) > MAX_LINE_BYTES and not line.endswith(b"\n"):
                    while (more := src.readline(MAX_LINE_BYTES)) and not more.endswith(b"\n"):
                        pass
                    yield number, None
                    continue
                yield number, line
        except (OSError, EOFError, zlib.error) as exc:
            raise ConfigError(f"{path}: not a readable gzip/JSONL file ({exc})") from exc


def _checked(line: bytes | None, seen: set[str]) -> EvalConversation:
    if line is None:
        raise _Bad("oversized_line")
    conv = parse_record(line)
    if conv.conversation_id in seen:
        raise _Bad("duplicate_id")
    return conv


def read_dataset(path: Path, *, max_bytes: int, strict: bool = False) -> tuple[list[EvalConversation], ReadReport]:
    """Every valid conversation of ``path`` in file order, and what was skipped."""
    if not path.is_file():
        raise ConfigError(f"input file {path} does not exist or is not a file")
    size = path.stat().st_size
    if size == 0:
        raise ConfigError(f"{path} is empty")
    if size > max_bytes:
        raise ConfigError(f"{path} is {size} bytes; the limit is {max_bytes} (--max-input-bytes)")
    report = ReadReport()
    out: list[EvalConversation] = []
    seen: set[str] = set()
    for number, line in _lines(path, max_bytes):
        if line is not None and not line.strip():
            continue
        try:
            conv = _checked(line, seen)
        except _Bad as bad:
            if strict:
                raise ConfigError(f"{path}: line {number}: {bad.reason.replace('_', ' ')} (without --strict "
                                  "such lines are skipped)") from None
            report.skip(number, bad.reason)
            continue
        seen.add(conv.conversation_id)
        out.append(conv)
        report.read += 1
    if not out:
        detail = "; ".join(report.problems) or "no lines"
        raise ConfigError(f"{path}: no valid conversation ({detail})")
    return out, report
