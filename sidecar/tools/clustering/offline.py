"""Offline clustering of a JSONL file of conversations (what ``sidecar clusters`` runs).

Input: the shared dataset schema, read with :mod:`sidecar.transcript.dataset` (gzip allowed; a
line that is not a conversation - invalid JSON or UTF-8, wrong types, unknown roles, over the size
limit - is skipped and counted, never fatal). Only the messages are read to build summaries; any
other field (``--goal-field``) is read only to score the result against known goals.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sidecar.clustering.algorithm import ClusteringResult, gather_or_cancel, llm_guided_clustering
from sidecar.clustering.config import ClusteringConfig
from sidecar.clustering.embed import Embedder, Matrix
from sidecar.clustering.llm import GoalLLM
from sidecar.transcript.dataset import ConversationRecord, ReadStats, read_conversations
from sidecar.transcript.model import Message

__all__ = ["Conversation", "ReadStats", "cluster_conversations", "iter_conversations", "summarize_all"]


@dataclass(frozen=True, slots=True)
class Conversation:
    conversation_id: str
    messages: tuple[Message, ...]
    goal: str | None = None


def conversation(rec: ConversationRecord, goal_field: str | None) -> Conversation:
    """What clustering needs of a dataset record: its messages and, if asked, its known goal."""
    goal = rec.lookup(goal_field) if goal_field else None
    return Conversation(rec.conversation_id, rec.messages, None if goal is None else str(goal))


def iter_conversations(
    path: Path, goal_field: str | None = None, stats: ReadStats | None = None
) -> Iterator[Conversation]:
    """Valid conversations of a JSONL(.gz) file, in file order."""
    st = stats if stats is not None else ReadStats()
    for rec in read_conversations(path, stats=st):
        yield conversation(rec, goal_field)


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
