"""The one reader of conversation datasets: gzipped or plain JSONL in the shared datasets' schema.

One conversation per line::

    {"conversation_id": str, "turns" | "messages": [{"role", "content", "tool_calls"?, "name"?}],
     "source"?: str, "domain"?: str, "meta"?: {...}, ...}

``turns`` is read when present, else ``messages``. A message's ``content`` defaults to ``""``; a
tool call is ``{"name": str, "arguments"?: str}`` (a non-string ``arguments`` value is kept as
its JSON text with sorted keys); a ``name`` that is not a string is ignored. Every other top-level
field is kept untouched in :attr:`ConversationRecord.fields`: callers (eval, judge, clustering,
the simulator, the demo, the adapters) convert the record into what they need.

The limits policy, the same for every caller:

- A line is at most :data:`MAX_LINE_BYTES` (8 MiB, newline included). A longer line is drained
  in chunks without being held in memory and counted as ``oversized_line``.
- What one :class:`ReadStats` has read is at most ``ReadLimits.max_total_bytes`` bytes, counted
  after decompression, so a gzip bomb stops at the cap. Past the cap reading is an error
  (:class:`DatasetError`), never a silent cut. A file whose size on disk is already over what is
  left is refused before it is opened.
- At most ``ReadLimits.max_records`` records are yielded (None: no cap); reading then stops and
  :attr:`ReadStats.capped` says so.
- A malformed line (over the line limit, invalid UTF-8, invalid JSON or nested too deep, not an
  object, a missing or bad ``conversation_id``, no message list, more than :data:`MAX_MESSAGES`
  messages, a message that is not one) is skipped and counted by reason with its line number; with
  ``strict=True`` the first one is a :class:`DatasetError` naming the line instead.
- A missing path, a directory, or a file that is not gzip (for ``*.gz``) is a
  :class:`DatasetError`.

Blank lines are ignored. Nothing here logs or prints: what was skipped is in :class:`ReadStats`.
"""

from __future__ import annotations

import gzip
import json
import zlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Final, cast

from sidecar.errors import ConfigError
from sidecar.transcript.model import ROLES, Message, ToolCall

MAX_LINE_BYTES: Final = 8 * 1024 * 1024
MAX_TOTAL_BYTES: Final = 4 * 1024**3
MAX_MESSAGES: Final = 2000
MAX_ID_CHARS: Final = 512
# Dataset artefacts that give the answer away (tau-bench's user-simulator stop token).
ARTEFACTS: Final[tuple[str, ...]] = ("###STOP###",)
# The rest of an oversized line is drained in pieces of this size.
_DRAIN_CHUNK: Final = 1 << 20
_SHOWN_PROBLEMS: Final = 5


class DatasetError(ConfigError):
    """A dataset file cannot be read as a whole, or (strict mode) one of its lines is malformed.

    ``reason`` is a stable identifier (``missing``, ``not_a_file``, ``too_large``, ``unreadable``,
    or a line reason such as ``invalid_json``); ``line`` is the 1-based line number, if any.
    """

    def __init__(self, message: str, *, reason: str, line: int | None = None) -> None:
        super().__init__(message)
        self.reason = reason
        self.line = line


class InvalidRecord(ValueError):
    """One record does not follow the schema; ``reason`` is the counted skip reason."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason.replace("_", " "))
        self.reason = reason


@dataclass(frozen=True, slots=True)
class ReadLimits:
    """Bounds on one read (see the module docstring). ``flag`` is the command-line option that
    sets ``max_total_bytes``, named in the error past it."""

    max_line_bytes: int = MAX_LINE_BYTES
    max_total_bytes: int = MAX_TOTAL_BYTES
    max_records: int | None = None
    flag: str | None = None


@dataclass(slots=True)
class ReadStats:
    """What reading met, filled as records are consumed; one object may span several files."""

    files: int = 0
    lines: int = 0
    bytes: int = 0
    records: int = 0
    skipped: dict[str, int] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    capped: bool = False

    def skip(self, reason: str, line: int | None = None) -> None:
        """Count a skipped line (the first few are kept with their line numbers)."""
        self.skipped[reason] = self.skipped.get(reason, 0) + 1
        if len(self.problems) < _SHOWN_PROBLEMS:
            where = f"line {line}: " if line is not None else ""
            self.problems.append(where + reason.replace("_", " "))

    def drop(self, line: int, reason: str) -> None:
        """A record read but rejected by the caller: no longer counted as read, counted as skipped."""
        self.records -= 1
        self.skip(reason, line)

    @property
    def malformed(self) -> int:
        return sum(self.skipped.values())


@dataclass(frozen=True, slots=True)
class ConversationRecord:
    """One conversation as the file has it: id, parsed messages, every other top-level field."""

    conversation_id: str
    messages: tuple[Message, ...]
    fields: Mapping[str, Any] = field(default_factory=dict)
    line: int = 0

    @property
    def source(self) -> str | None:
        """The dataset tag, when the record has a non-empty string one."""
        value = self.fields.get("source")
        return value if isinstance(value, str) and value else None

    @property
    def domain(self) -> str | None:
        value = self.fields.get("domain")
        return value if isinstance(value, str) else None

    @property
    def meta(self) -> Mapping[str, Any]:
        value = self.fields.get("meta")
        return value if isinstance(value, dict) else {}

    def lookup(self, dotted: str) -> Any:
        """The value at a dotted path of the record's fields (``meta.success``, ``meta.tasks.0``)."""
        return lookup(self.fields, dotted)


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


def _arguments(value: Any) -> str:
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, sort_keys=True)
    except (TypeError, ValueError, RecursionError) as exc:
        raise InvalidRecord("bad_message") from exc


def parse_message(raw: Any) -> Message:
    """One message of the schema; raises :class:`InvalidRecord` (``bad_message``)."""
    if not isinstance(raw, dict):
        raise InvalidRecord("bad_message")
    role, content = raw.get("role"), raw.get("content", "")
    if role not in ROLES or not isinstance(content, str):
        raise InvalidRecord("bad_message")
    calls_raw = raw.get("tool_calls") or []
    if not isinstance(calls_raw, list):
        raise InvalidRecord("bad_message")
    calls: list[ToolCall] = []
    for c in calls_raw:
        if not isinstance(c, dict) or not isinstance(c.get("name"), str):
            raise InvalidRecord("bad_message")
        calls.append(ToolCall(c["name"], _arguments(c.get("arguments", ""))))
    name = raw.get("name")
    return Message(role, content, name if isinstance(name, str) else None, tuple(calls))


def parse_messages(raw: Any) -> tuple[Message, ...]:
    """A message list; raises :class:`InvalidRecord` (``bad_messages`` or ``bad_message``)."""
    if not isinstance(raw, list) or len(raw) > MAX_MESSAGES:
        raise InvalidRecord("bad_messages")
    return tuple(parse_message(m) for m in raw)


def parse_conversation(rec: Any, line: int = 0) -> ConversationRecord:
    """One decoded JSON value as a conversation; raises :class:`InvalidRecord`."""
    if not isinstance(rec, dict):
        raise InvalidRecord("not_an_object")
    cid = rec.get("conversation_id")
    if not isinstance(cid, str) or not cid or len(cid) > MAX_ID_CHARS:
        raise InvalidRecord("bad_conversation_id")
    key = "turns" if "turns" in rec else "messages"
    messages = parse_messages(rec.get(key))
    fields = {k: v for k, v in rec.items() if k not in ("conversation_id", "turns", "messages")}
    return ConversationRecord(cid, messages, fields, line)


def decode_object(line: bytes, max_line_bytes: int = MAX_LINE_BYTES) -> dict[str, Any]:
    """One JSONL line as a JSON object; raises :class:`InvalidRecord`."""
    if len(line) > max_line_bytes:
        raise InvalidRecord("oversized_line")
    try:
        rec = json.loads(line.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise InvalidRecord("invalid_utf8") from exc
    except (ValueError, RecursionError) as exc:
        raise InvalidRecord("invalid_json") from exc
    if not isinstance(rec, dict):
        raise InvalidRecord("not_an_object")
    return rec


def parse_line(line: bytes, max_line_bytes: int = MAX_LINE_BYTES, number: int = 0) -> ConversationRecord:
    """One JSONL line as a conversation; raises :class:`InvalidRecord`, never anything else."""
    return parse_conversation(decode_object(line, max_line_bytes), number)


def strip_artefacts(text: str) -> str:
    """``text`` without the answer-revealing dataset artefacts (stripped when one was there)."""
    out = text
    for art in ARTEFACTS:
        if art in out:
            out = out.replace(art, "").strip()
    return out


def without_artefacts(messages: Sequence[Message]) -> tuple[Message, ...]:
    """The messages cleaned of artefacts; a message left empty (and with no tool call) is dropped."""
    out: list[Message] = []
    for m in messages:
        cleaned = strip_artefacts(m.content)
        if cleaned == m.content:
            out.append(m)
        elif cleaned or m.tool_calls:
            out.append(Message(m.role, cleaned, m.name, m.tool_calls))
    return tuple(out)


def message_json(m: Message) -> dict[str, Any]:
    """A message in the schema's JSON form (what :func:`parse_message` reads back)."""
    out: dict[str, Any] = {"role": m.role, "content": m.content}
    if m.name is not None:
        out["name"] = m.name
    if m.tool_calls:
        out["tool_calls"] = [{"name": c.name, "arguments": c.arguments} for c in m.tool_calls]
    return out


def record_json(record: ConversationRecord) -> dict[str, Any]:
    """A record back in the schema's JSON form, its messages under ``turns``."""
    return {
        "conversation_id": record.conversation_id,
        **record.fields,
        "turns": [message_json(m) for m in record.messages],
    }


def check_file(path: Path, limits: ReadLimits, already_read: int = 0) -> None:
    """Refuse a missing path, a non-file, or a file already over what is left of the byte cap."""
    if not path.exists():
        raise DatasetError(f"{path} does not exist", reason="missing")
    if not path.is_file():
        raise DatasetError(f"{path} is not a regular file", reason="not_a_file")
    size = path.stat().st_size
    left = limits.max_total_bytes - already_read
    if size > left:
        raise DatasetError(f"{path} is {size} bytes; the limit is {left}{_hint(limits)}", reason="too_large")


def _hint(limits: ReadLimits) -> str:
    return f" ({limits.flag})" if limits.flag else ""


def _open(path: Path) -> IO[bytes]:
    try:
        if path.name.endswith(".gz"):
            return cast("IO[bytes]", gzip.open(path, "rb"))
        return path.open("rb")
    except OSError as exc:
        raise DatasetError(f"cannot read {path}: {exc.strerror or exc}", reason="unreadable") from exc


def _lines(fh: IO[bytes], path: Path, limits: ReadLimits, stats: ReadStats) -> Iterator[tuple[int, bytes | None]]:
    """(line number, bytes) of every line; None for an oversized line, drained without holding it."""

    def count(n: int) -> None:
        stats.bytes += n
        if stats.bytes > limits.max_total_bytes:
            raise DatasetError(
                f"{path}: more than {limits.max_total_bytes} bytes of data (after decompression){_hint(limits)}",
                reason="too_large",
            )

    number = 0
    while line := fh.readline(limits.max_line_bytes + 1):
        count(len(line))
        number += 1
        stats.lines += 1
        if len(line) <= limits.max_line_bytes:
            yield number, line
            continue
        while not line.endswith(b"\n") and (line := fh.readline(_DRAIN_CHUNK)):
            count(len(line))
        yield number, None


def read_objects(
    path: Path, *, stats: ReadStats, limits: ReadLimits | None = None, strict: bool = False
) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, JSON object) of every well-formed line of a JSONL(.gz) file, in file order."""
    lim = limits or ReadLimits()
    check_file(path, lim, stats.bytes)
    stats.files += 1
    with _open(path) as fh:
        try:
            for number, line in _lines(fh, path, lim, stats):
                if lim.max_records is not None and stats.records >= lim.max_records:
                    stats.capped = True
                    return
                if line is None:
                    _bad_line(path, number, InvalidRecord("oversized_line"), stats, strict)
                    continue
                if not line.strip():
                    continue
                try:
                    rec = decode_object(line, lim.max_line_bytes)
                except InvalidRecord as bad:
                    _bad_line(path, number, bad, stats, strict)
                    continue
                stats.records += 1
                yield number, rec
        except (OSError, EOFError, zlib.error) as exc:  # gzip.BadGzipFile is an OSError
            raise DatasetError(f"{path}: not a readable gzip/JSONL file ({exc})", reason="unreadable") from exc


def read_conversations(
    path: Path, *, stats: ReadStats, limits: ReadLimits | None = None, strict: bool = False
) -> Iterator[ConversationRecord]:
    """Every well-formed conversation of a JSONL(.gz) file, in file order."""
    for number, rec in read_objects(path, stats=stats, limits=limits, strict=strict):
        try:
            conv = parse_conversation(rec, number)
        except InvalidRecord as bad:
            stats.records -= 1
            _bad_line(path, number, bad, stats, strict)
            continue
        yield conv


def _bad_line(path: Path, number: int, bad: InvalidRecord, stats: ReadStats, strict: bool) -> None:
    if strict:
        raise DatasetError(f"{path}: line {number}: {bad}", reason=bad.reason, line=number) from None
    stats.skip(bad.reason, number)


__all__ = [
    "ARTEFACTS",
    "MAX_ID_CHARS",
    "MAX_LINE_BYTES",
    "MAX_MESSAGES",
    "MAX_TOTAL_BYTES",
    "ConversationRecord",
    "DatasetError",
    "InvalidRecord",
    "ReadLimits",
    "ReadStats",
    "check_file",
    "decode_object",
    "lookup",
    "message_json",
    "parse_conversation",
    "parse_line",
    "parse_message",
    "parse_messages",
    "read_conversations",
    "read_objects",
    "record_json",
    "strip_artefacts",
    "without_artefacts",
]
