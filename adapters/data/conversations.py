"""Conversations (the shared datasets' JSONL schema) to SFT examples and evaluation examples.

Records are parsed by :mod:`sidecar.transcript.dataset` (the one reader and message parser);
this module turns a record into the adapters' :class:`Conversation`:

- Cleaning: dataset artefacts that give the answer away are stripped (tau-bench's ``###STOP###``
  user-simulator token); a message left empty by that (and carrying no tool call) is dropped.
  ``meta`` is never turned into model input: only ``turns`` are.
- Split: a stable hash of ``meta.split_group`` (else the conversation id) puts each conversation
  on the train or the test side, 50/50, so grouped conversations (tau-bench's trials of one task,
  OptimouseQuest's dialogues of one problem) never straddle the split.
- Truncation (paper Section 5.2): an n-turn conversation (n = number of user messages) gets an
  incomplete copy c_k = [p_1, r_1, ..., p_k, r_k] with k drawn uniformly from 1..n-1, seeded by
  the conversation id, so re-runs give the same copies.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import structlog

from sidecar.transcript.dataset import (
    ConversationRecord,
    InvalidRecord,
    ReadStats,
    parse_conversation,
    parse_message,
    without_artefacts,
)
from sidecar.transcript.model import Message, count_turns, prefix_through_turn

log = structlog.get_logger()

# A record that does not follow the datasets schema (its ``reason`` is the counted skip reason).
BadRecordError = InvalidRecord


@dataclass(frozen=True, slots=True)
class Conversation:
    """A cleaned conversation; ``real_complete`` is a dataset's own completion label, if any."""

    conversation_id: str
    dataset: str
    split_group: str
    messages: tuple[Message, ...]
    real_complete: bool | None = None
    real_label_source: str | None = None


@dataclass(frozen=True, slots=True)
class Example:
    """One evaluation example: a (possibly truncated) conversation and its label."""

    conversation_id: str
    dataset: str
    messages: tuple[Message, ...]
    complete: bool
    kind: str  # "full" | "truncated"
    extra: dict[str, Any] = field(default_factory=dict)


def _real_label(dataset: str, meta: dict[str, Any]) -> tuple[bool | None, str | None]:
    if "completed" in meta and isinstance(meta["completed"], bool):
        return meta["completed"], "meta.completed (STAR completion_level)"
    reward = meta.get("reward")
    if isinstance(reward, int | float) and dataset.startswith("taubench"):
        return float(reward) >= 1.0, "meta.reward == 1 (tau-bench task reward)"
    return None, None


def from_record(rec: ConversationRecord) -> Conversation:
    """The adapters' cleaned conversation of a dataset record; raises :class:`BadRecordError`
    (``bad_messages``) for a record without messages."""
    if not rec.messages:
        raise BadRecordError("bad_messages")
    meta = dict(rec.meta)
    dataset = rec.source or rec.conversation_id.split("/", 1)[0]
    group = meta.get("split_group")
    real, label_source = _real_label(dataset, meta)
    return Conversation(
        conversation_id=rec.conversation_id,
        dataset=dataset,
        split_group=group if isinstance(group, str) and group else rec.conversation_id,
        messages=without_artefacts(rec.messages),
        real_complete=real,
        real_label_source=label_source,
    )


def parse_record(rec: Any) -> Conversation:
    """Validate and clean one decoded record; raises :class:`BadRecordError`."""
    return from_record(parse_conversation(rec))


def stable_unit(key: str, salt: str = "") -> float:
    """A deterministic number in [0, 1) from ``key``."""
    digest = hashlib.sha256(f"{salt}\x00{key}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def split_of(conv: Conversation) -> str:
    """``"train"`` or ``"test"``: the paper's 50/50 split, stable across runs and machines."""
    return "train" if stable_unit(conv.split_group, "split") < 0.5 else "test"


def truncation_turn(conv: Conversation, seed: int) -> int | None:
    """The k in 1..n-1 at which the incomplete copy is cut, or None when n < 2."""
    n = count_turns(conv.messages)
    if n < 2:
        return None
    rng = random.Random(f"{seed}:{conv.conversation_id}")
    return rng.randint(1, n - 1)


def truncate(messages: Sequence[Message], k: int) -> tuple[Message, ...]:
    """c_k: the messages of turns 0..k."""
    return tuple(prefix_through_turn(messages, k))


def target_start(messages: Sequence[Message]) -> int:
    """Index of the first message of the training target (r_n, the final response).

    r_n is everything after the last user message. When a conversation ends with a user message
    (the user closes it, as in tau-bench and OptimouseQuest), that closing message is the target.
    """
    if not messages:
        raise ValueError("empty conversation")
    last_user = max((i for i, m in enumerate(messages) if m.role == "user"), default=-1)
    if last_user == len(messages) - 1 or last_user < 0:
        return len(messages) - 1
    return last_user + 1


def train_record_conversation(rec: dict[str, Any], dataset: str) -> Conversation:
    """A ``train.jsonl`` record of ``prepare`` back as a :class:`Conversation` (its own label kept)."""
    return Conversation(
        rec["conversation_id"],
        dataset,
        rec["conversation_id"],
        messages_from_json(rec["messages"]),
        real_complete=rec.get("real_complete"),
        real_label_source=rec.get("real_label_source"),
    )


def in_truncation_protocol(real_complete: bool | None, real_label_source: str | None) -> bool:
    """Whether a conversation can be a "complete" example of the truncation protocol.

    The protocol needs complete conversations as positives: conversations a dataset itself marks
    as not completed (STAR disconnects) are left out of it and scored separately. tau-bench's
    failed tasks stay: the conversation did end, the task reward is about its outcome.
    """
    return real_label_source is None or "STAR" not in real_label_source or bool(real_complete)


def eval_examples(conv: Conversation, seed: int) -> list[Example]:
    """The full conversation (complete) and its truncated copy (incomplete), if it has one."""
    out = [Example(conv.conversation_id, conv.dataset, conv.messages, complete=True, kind="full")]
    k = truncation_turn(conv, seed)
    if k is not None:
        out.append(
            Example(
                conv.conversation_id,
                conv.dataset,
                truncate(conv.messages, k),
                complete=False,
                kind="truncated",
                extra={"k": k, "n": count_turns(conv.messages)},
            )
        )
    return out


def messages_from_json(items: Sequence[Any]) -> tuple[Message, ...]:
    """The messages of a prepared record (``train.jsonl``, ``test.jsonl``): the dataset schema's."""
    return tuple(parse_message(t) for t in items)


def stats_json(stats: ReadStats) -> dict[str, Any]:
    """What a manifest records of a read (no message text)."""
    return {
        "files": stats.files,
        "lines": stats.lines,
        "bytes": stats.bytes,
        "conversations": stats.records,
        "malformed": stats.malformed,
        "malformed_reasons": dict(sorted(stats.skipped.items())),
    }
