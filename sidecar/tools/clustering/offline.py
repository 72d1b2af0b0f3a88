"""Offline clustering of a JSONL file of conversations (what ``sidecar clusters`` runs).

Input: one conversation per line, ``{"conversation_id": str, "turns" | "messages": [{"role",
"content", "tool_calls"?, "name"?}, ...]}`` (the shared dataset schema, gzip allowed). A line that
is not such an object - invalid JSON or UTF-8, wrong types, unknown roles, over the size limit - is
skipped and counted, never fatal. Only the messages are read to build summaries; any other field
(``--goal-field``) is read only to score the result against known goals.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, cast

import numpy as np

from sidecar.clustering.algorithm import ClusteringResult, gather_or_cancel, llm_guided_clustering
from sidecar.clustering.config import ClusteringConfig
from sidecar.clustering.embed import Embedder, Matrix
from sidecar.clustering.llm import GoalLLM
from sidecar.transcript.model import ROLES, Message, ToolCall

MAX_LINE_BYTES = 4 * 1024 * 1024
MAX_MESSAGES = 2000


@dataclass(frozen=True, slots=True)
class Conversation:
    conversation_id: str
    messages: tuple[Message, ...]
    goal: str | None = None


@dataclass(slots=True)
class ReadStats:
    read: int = 0
    skipped: dict[str, int] = field(default_factory=dict)

    def skip(self, reason: str) -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + 1


def _lookup(record: Any, dotted: str) -> Any:
    cur = record
    for part in dotted.split("."):
        if isinstance(cur, dict):
            cur = cur.get(part)
        elif isinstance(cur, list) and part.isdigit() and int(part) < len(cur):
            cur = cur[int(part)]
        else:
            return None
    return cur


def _message(raw: Any) -> Message | None:
    if not isinstance(raw, dict):
        return None
    role, content = raw.get("role"), raw.get("content", "")
    if role not in ROLES or not isinstance(content, str):
        return None
    calls: list[ToolCall] = []
    for c in raw.get("tool_calls") or []:
        if isinstance(c, dict) and isinstance(c.get("name"), str):
            args = c.get("arguments", "")
            calls.append(ToolCall(c["name"], args if isinstance(args, str) else json.dumps(args)))
    name = raw.get("name")
    return Message(role=role, content=content, name=name if isinstance(name, str) else None, tool_calls=tuple(calls))


class _Skip(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _decode(line: bytes) -> dict[str, Any]:
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
    raw_msgs = rec.get("turns", rec.get("messages"))
    if not isinstance(raw_msgs, list) or len(raw_msgs) > MAX_MESSAGES:
        raise _Skip("bad_messages")
    msgs = [_message(m) for m in raw_msgs]
    out = tuple(m for m in msgs if m is not None)
    if len(out) != len(msgs):
        raise _Skip("bad_message")
    return out


def parse_line(line: bytes, goal_field: str | None, stats: ReadStats) -> Conversation | None:
    """One JSONL line as a conversation, or None (and a counted reason)."""
    try:
        rec = _decode(line)
        msgs = _messages(rec)
    except _Skip as skip:
        stats.skip(skip.reason)
        return None
    goal = _lookup(rec, goal_field) if goal_field else None
    stats.read += 1
    return Conversation(
        rec["conversation_id"],
        msgs,
        None if goal is None else str(goal),
    )


def _open(path: Path) -> IO[bytes]:
    if path.suffix == ".gz":
        return cast("IO[bytes]", gzip.open(path, "rb"))
    return path.open("rb")


def iter_conversations(
    path: Path, goal_field: str | None = None, stats: ReadStats | None = None
) -> Iterator[Conversation]:
    """Valid conversations of a JSONL(.gz) file, in file order."""
    st = stats if stats is not None else ReadStats()
    with _open(path) as fh:
        while True:
            line = fh.readline(MAX_LINE_BYTES + 1)
            if not line:
                return
            if len(line) > MAX_LINE_BYTES and not line.endswith(b"\n"):
                # Drain the rest of the oversized line without holding it.
                while True:
                    more = fh.readline(MAX_LINE_BYTES)
                    if not more or more.endswith(b"\n"):
                        break
            if not line.strip():
                continue
            conv = parse_line(line, goal_field, st)
            if conv is not None:
                yield conv


async def summarize_all(convs: Sequence[Conversation], llm: GoalLLM, concurrency: int = 8) -> list[str]:
    """Goal summary of every conversation, in order."""
    import asyncio

    sem = asyncio.Semaphore(concurrency)

    async def one(c: Conversation) -> str:
        async with sem:
            return await llm.summarize(c.messages)

    return await gather_or_cancel(one(c) for c in convs)


async def cluster_conversations(
    summaries: Sequence[str],
    vectors: Matrix,
    config: ClusteringConfig,
    llm: GoalLLM,
    embedder: Embedder,
    *,
    seed: int,
    order_seed: int | None = None,
) -> ClusteringResult:
    """Algorithm 1 on the given rows, optionally in a shuffled order; results in input order."""
    n = len(summaries)
    perm = np.arange(n) if order_seed is None else np.random.default_rng(order_seed).permutation(n)
    res = await llm_guided_clustering(
        [summaries[i] for i in perm],
        vectors[perm],
        llm=llm,
        embedder=embedder,
        k1=config.k1,
        examples=config.examples_per_group,
        seed=seed,
        stop_rule=config.stop_rule,
        max_merge_queries=config.max_merge_queries,
        kmeans_n_init=config.kmeans_n_init,
    )
    inverse = np.empty(n, dtype=np.int64)
    inverse[perm] = np.arange(n)
    return ClusteringResult(
        k=res.k,
        labels=res.labels,
        assignments=res.assignments[inverse],
        centroids=res.centroids,
        sizes=res.sizes,
        stats=res.stats,
    )
