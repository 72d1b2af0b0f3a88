"""The evaluation input: a JSONL(.gz) file of conversations in the shared dataset schema.

Read with :mod:`sidecar.transcript.dataset` (its limits policy: 8 MiB lines, a byte cap counted
after decompression, malformed lines skipped and counted, or with ``strict`` the error). Only the
messages are scored. ``source`` groups the report's rows; a few ``meta`` fields, when present, are
outcome labels the report can hold the scores against (never shown to a model): ``completed`` and
``completion_level`` (STAR), ``user_reported_task_success`` (STAR), ``reward`` and ``success``
(tau-bench).

On top of the reader's reasons, a conversation without a user message (``no_user_message``) or
with an id already seen (``duplicate_id``) is skipped. A missing, empty or oversized file, or one
without a valid conversation, is a :class:`~sidecar.errors.ConfigError`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sidecar.errors import ConfigError
from sidecar.transcript.dataset import ConversationRecord, DatasetError, ReadLimits, ReadStats, read_conversations
from sidecar.transcript.model import Message, count_turns

LABEL_FIELDS = ("completed", "completion_level", "user_reported_task_success", "reward", "success")


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

    def describe(self) -> str:
        if not self.skipped:
            return f"{self.read} conversations"
        counts = ", ".join(f"{k} {v}" for k, v in sorted(self.skipped.items()))
        return f"{self.read} conversations, {sum(self.skipped.values())} lines skipped ({counts})"


def _labels(meta: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in LABEL_FIELDS:
        value = meta.get(key)
        if isinstance(value, bool | str) or (isinstance(value, int | float) and not isinstance(value, bool)):
            out[key] = value if not isinstance(value, str) else value[:64]
    return out


def eval_conversation(rec: ConversationRecord) -> EvalConversation:
    """The evaluation's view of a dataset record."""
    source, domain = rec.source, rec.domain
    return EvalConversation(
        rec.conversation_id,
        rec.messages,
        source[:64] if source else "unknown",
        domain[:64] if domain is not None else "",
        _labels(rec.meta),
    )


def _conversations(path: Path, max_bytes: int, strict: bool, stats: ReadStats) -> Iterator[EvalConversation]:
    seen: set[str] = set()
    limits = ReadLimits(max_total_bytes=max_bytes, flag="--max-input-bytes")
    for rec in read_conversations(path, stats=stats, limits=limits, strict=strict):
        reason = (
            "no_user_message"
            if count_turns(rec.messages) == 0
            else "duplicate_id"
            if rec.conversation_id in seen
            else None
        )
        if reason is None:
            seen.add(rec.conversation_id)
            yield eval_conversation(rec)
        elif strict:
            raise DatasetError(f"{path}: line {rec.line}: {reason.replace('_', ' ')}", reason=reason, line=rec.line)
        else:
            stats.drop(rec.line, reason)


def read_dataset(path: Path, *, max_bytes: int, strict: bool = False) -> tuple[list[EvalConversation], ReadReport]:
    """Every valid conversation of ``path`` in file order, and what was skipped."""
    if path.is_file() and path.stat().st_size == 0:
        raise ConfigError(f"{path} is empty")
    stats = ReadStats()
    try:
        out = list(_conversations(path, max_bytes, strict, stats))
    except DatasetError as exc:
        if exc.line is None:
            raise
        raise ConfigError(f"{exc} (without --strict such lines are skipped)") from None
    report = ReadReport(len(out), stats.skipped, stats.problems)
    if not out:
        detail = "; ".join(report.problems) or "no lines"
        raise ConfigError(f"{path}: no valid conversation ({detail})")
    return out, report
