"""What ``sidecar judge`` reads: conversations in the datasets' JSONL schema, as judge examples.

Files are read with :mod:`sidecar.transcript.dataset` (gzip allowed; its limits policy: lines over
8 MiB, invalid JSON or UTF-8, wrong types and unknown roles are skipped and counted by reason,
never fatal). A conversation without a user message is skipped as ``no_user_message``. A whole
file over ``max_file_bytes`` (on disk, or once decompressed) is refused.

Only ``turns`` become judge input. Dataset artefacts that give the answer away are stripped as the
adapters' data preparation strips them (tau-bench's ``###STOP###`` user-simulator token), so the
judge and the judge-free rows of a comparison see the same text. Labels, when asked for, come from
``meta`` (``--label-field``) or from the truncation protocol (paper Section 5.2 of the sidecar's
method, as ``adapters eval`` applies it): the full conversation is complete and a copy cut after
turn k, k drawn uniformly from 1..n-1 and seeded by the conversation id, is incomplete.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from sidecar.transcript.dataset import (
    ReadLimits,
    ReadStats,
    check_file,
    read_conversations,
    without_artefacts,
)
from sidecar.transcript.model import Message, count_turns, prefix_through_turn

Protocol = Literal["none", "truncation"]
__all__ = ["JudgeExample", "ReadStats", "as_label", "check_input", "read_examples", "truncation_turn"]


@dataclass(frozen=True, slots=True)
class JudgeExample:
    """One conversation (or its truncated copy) to judge, with its known label if any."""

    conversation_id: str
    source: str
    messages: tuple[Message, ...]
    kind: Literal["full", "truncated"] = "full"
    label: bool | None = None


def limits(max_file_bytes: int) -> ReadLimits:
    """The reader's limits with ``--max-file-bytes`` as the byte cap of each file."""
    return ReadLimits(max_total_bytes=max_file_bytes, flag="--max-file-bytes")


def check_input(path: Path, max_file_bytes: int) -> None:
    """Refuse a missing, unreadable or oversized file with a clear :class:`ConfigError`."""
    check_file(path, limits(max_file_bytes))


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
    path: Path,
    *,
    stats: ReadStats,
    protocol: Protocol = "none",
    label_field: str | None = None,
    seed: int = 0,
    max_file_bytes: int | None = None,
) -> Iterator[JudgeExample]:
    """The judge examples of one file, in file order (with ``truncation``: full, then its copy).

    ``stats`` may gather several files; ``max_file_bytes`` bounds each file on its own.
    """
    lim = limits(max_file_bytes) if max_file_bytes is not None else ReadLimits()
    lim = ReadLimits(max_total_bytes=stats.bytes + lim.max_total_bytes, flag=lim.flag)
    for rec in read_conversations(path, stats=stats, limits=lim):
        msgs = without_artefacts(rec.messages)
        if count_turns(msgs) == 0:
            stats.drop(rec.line, "no_user_message")
            continue
        cid, source = rec.conversation_id, str(rec.fields.get("source") or "")
        if protocol == "none":
            yield JudgeExample(cid, source, msgs, label=as_label(rec.lookup(label_field)) if label_field else None)
            continue
        if rec.lookup("meta.completed") is False:
            # The protocol needs complete conversations as positives: a conversation the dataset
            # itself marks as not completed (STAR disconnects) is left out, as adapters eval does.
            stats.skip("marked_not_completed", rec.line)
            continue
        yield JudgeExample(cid, source, msgs, "full", True)
        k = truncation_turn(cid, count_turns(msgs), seed)
        if k is not None:
            yield JudgeExample(cid, source, tuple(prefix_through_turn(msgs, k)), "truncated", False)
