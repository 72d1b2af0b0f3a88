"""Goal clusters of the evaluated conversations, through the offline path of ``sidecar clusters``
(summaries, embeddings, Algorithm 1), with each cluster's completion rate from the sidecar's own
verdicts on the full conversations (the paper's Figures 3 and 5 give the largest clusters)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

from prometheus_client import CollectorRegistry

from sidecar.clustering.config import ClusteringConfig
from sidecar.clustering.embed import build_embedder
from sidecar.clustering.llm import ExtractiveGoalLLM, GoalLLM, OpenAIGoalLLM
from sidecar.clustering.metrics import ClusteringMetrics
from sidecar.tools.clustering.offline import Conversation, cluster_conversations, summarize_all
from sidecar.tools.eval.dataset import EvalConversation

MIN_CONVERSATIONS = 4


async def cluster_goals(
    convs: Sequence[EvalConversation], config: ClusteringConfig, verdicts: Mapping[str, bool | None]
) -> dict[str, Any]:
    """``{"k", "mode", "clusters": [{cluster, label, size, scored, complete, completion_rate}],
    "assignments": {id: cluster}}``; clusters by decreasing size."""
    if len(convs) < MIN_CONVERSATIONS:
        return {
            "k": 0,
            "mode": config.mode,
            "clusters": [],
            "assignments": {},
            "skipped": f"fewer than {MIN_CONVERSATIONS} conversations",
        }
    metrics = ClusteringMetrics(CollectorRegistry())
    llm: GoalLLM = OpenAIGoalLLM(config, metrics) if config.mode == "llm" else ExtractiveGoalLLM(config)
    embedder = build_embedder(config.embedding)
    try:
        # Only the messages are summarised: labels and sources never reach the summariser.
        summaries = await summarize_all(
            [Conversation(c.conversation_id, c.messages) for c in convs], llm, concurrency=config.llm.max_concurrency
        )
        vectors = await asyncio.to_thread(embedder.embed, summaries)
        # k1 is an overestimate of the goal count; on a small file the configured one (40 by
        # default, sized for a live reservoir) would give every conversation its own cluster.
        k1 = max(2, min(config.k1, len(convs) // 5))
        cfg = config.model_copy(update={"k1": k1})
        result = await cluster_conversations(summaries, vectors, cfg, llm, embedder, seed=config.seed)
    finally:
        if isinstance(llm, OpenAIGoalLLM):
            await llm.aclose()
    clusters: list[dict[str, Any]] = []
    for c in range(result.k):
        members = [convs[i].conversation_id for i in range(len(convs)) if int(result.assignments[i]) == c]
        known = [verdicts[m] for m in members if verdicts.get(m) is not None]
        complete = sum(1 for v in known if v)
        clusters.append(
            {
                "cluster": c,
                "label": result.labels[c],
                "size": len(members),
                "scored": len(known),
                "complete": complete,
                "completion_rate": complete / len(known) if known else None,
            }
        )
    clusters.sort(key=lambda r: (-r["size"], r["cluster"]))
    return {
        "k": result.k,
        "mode": config.mode,
        "clusters": clusters,
        "assignments": {c.conversation_id: int(result.assignments[i]) for i, c in enumerate(convs)},
    }
