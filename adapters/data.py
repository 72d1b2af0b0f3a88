"""Conversations (the shared datasets' JSONL schema) to SFT examples and evaluation examples.

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
import json
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import structlog

from sidecar.transcript.model import ROLES, Message, Role, ToolCall, count_turns, prefix_through_turn

log = structlog.get_logger()

ARTEFACTS: tuple[str, ...] = ("###STOP###",)
MAX_LINE_BYTES = 8 * 1024 * 1024
MAX_MESSAGES = 2000
# Bounds of reading one source (see adapters.sources): decompressed bytes, 4 GiB by default.
DEFAULT_MAX_BYTES = 4 * 1024**3


@dataclass(frozen=True, slots=True)
class ReadLimits:
    """Bounds on one source: decompressed bytes (an error past it) and conversations (a stop)."""

    max_bytes: int = DEFAULT_MAX_BYTES
    max_conversations: int | None = None


@dataclass(slots=True)
class ReadStats:
    """What reading a source met; filled while its conversations are consumed."""

    files: int = 0
    lines: int = 0
    bytes: int = 0
    conversations: int = 0
    malformed: int = 0
    reasons: dict[str, int] = field(default_factory=dict)

    def bad(self, reason: str) -> None:
        self.malformed += 1
        key = reason.split(":", 1)[0][:60]
        self.reasons[key] = self.reasons.get(key, 0) + 1

    def explain(self, name: str, without_user: int) -> str:
        """Why ``name`` gave no usable conversation, in one line."""
        reasons = ", ".join(f"{k}: {v}" for k, v in sorted(self.reasons.items()))
        return (f"data set {name!r} has no usable conversation: {self.lines} lines read, {self.malformed} "
                f"malformed{f' ({reasons})' if reasons else ''}, {without_user} without a user message")

    def as_json(self) -> dict[str, Any]:
        return {"files": self.files, "lines": self.lines, "bytes": self.bytes,
                "conversations": self.conversations, "malformed": self.malformed,
                "malformed_reasons": dict(sorted(self.reasons.items()))}


class BadRecordError(ValueError):
    """A JSONL record that does not follow the datasets schema."""


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


def strip_artefacts(text: str) -> str:
    """Remove answer-revealing dataset artefacts from message text."""
    out = text
    for art in ARTEFACTS:
        if art in out:
            out = out.replace(art, "").strip()
    return out


def _message(turn: Any) -> Message:
    if not isinstance(turn, dict):
        raise BadRecordError("turn is not an object")
    role = turn.get("role")
    if role not in ROLES:
        raise BadRecordError(f"bad role {role!r}")
    content = turn.get("content", "")
    if not isinstance(content, str):
        raise BadRecordError("content is not a string")
    calls_raw = turn.get("tool_calls") or []
    if not isinstance(calls_raw, list):
        raise BadRecordError("tool_calls is not a list")
    calls: list[ToolCall] = []
    for c in calls_raw:
        if not isinstance(c, dict) or not isinstance(c.get("name"), str):
            raise BadRecordError("bad tool call")
        args = c.get("arguments", "")
        calls.append(ToolCall(name=c["name"], arguments=args if isinstance(args, str) else json.dumps(args)))
    name = turn.get("name")
    r: Role = role
    return Message(role=r, content=content, name=name if isinstance(name, str) else None, tool_calls=tuple(calls))


def _real_label(dataset: str, meta: dict[str, Any]) -> tuple[bool | None, str | None]:
    if "completed" in meta and isinstance(meta["completed"], bool):
        return meta["completed"], "meta.completed (STAR completion_level)"
    reward = meta.get("reward")
    if isinstance(reward, int | float) and dataset.startswith("taubench"):
        return float(reward) >= 1.0, "meta.reward == 1 (tau-bench task reward)"
    return None, None


def parse_record(rec: Any) -> Conversation:
    """Validate and clean one record; raises :class:`BadRecordError`."""
    if not isinstance(rec, dict):
        raise BadRecordError("record is not an object")
    cid = rec.get("conversation_id")
    turns = rec.get("turns")
    if not isinstance(cid, str) or not cid:
        raise BadRecordError("missing conversation_id")
    if not isinstance(turns, list) or not turns:
        raise BadRecordError("missing turns")
    if len(turns) > MAX_MESSAGES:
        raise BadRecordError("too many turns")
    meta_raw = rec.get("meta")
    meta: dict[str, Any] = meta_raw if isinstance(meta_raw, dict) else {}
    source = rec.get("source")
    dataset: str = source if isinstance(source, str) and source else cid.split("/", 1)[0]
    messages: list[Message] = []
    for t in turns:
        m = _message(t)
        cleaned = strip_artefacts(m.content)
        if cleaned != m.content:
            if not cleaned and not m.tool_calls:
                continue
            m = Message(role=m.role, content=cleaned, name=m.name, tool_calls=m.tool_calls)
        messages.append(m)
    group = meta.get("split_group")
    real, label_source = _real_label(dataset, meta)
    return Conversation(
        conversation_id=cid,
        dataset=dataset,
        split_group=group if isinstance(group, str) and group else cid,
        messages=tuple(messages),
        real_complete=real,
        real_label_source=label_source,
    )


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
    return Conversation(rec["conversation_id"], dataset, rec["conversation_id"], messages_from_json(rec["messages"]),
                        real_complete=rec.get("real_complete"), real_label_source=rec.get("real_label_source"))


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
            Example(conv.conversation_id, conv.dataset, truncate(conv.messages, k), complete=False,
                    kind="truncated", extra={"k": k, "n": count_turns(conv.messages)})
        )
    return out


def message_to_json(m: Message) -> dict[str, Any]:
    d: dict[str, Any] = {"role": m.role, "content": m.content}
    if m.name is not None:
        d["name"] = m.name
    if m.tool_calls:
        d["tool_calls"] = [{"name": c.name, "arguments": c.arguments} for c in m.tool_calls]
    return d


def messages_from_json(items: Sequence[Any]) -> tuple[Message, ...]:
    return tuple(_message(t) for t in items)
