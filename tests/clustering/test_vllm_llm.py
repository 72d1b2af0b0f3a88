"""Algorithm 1 against the real vLLM CPU server, whose tiny random model answers nonsense.

The point is survival: every answer is either valid JSON of the asked schema or replaced by the
safe default and counted; the run completes; nothing is raised.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from prometheus_client import CollectorRegistry

from sidecar.clustering.algorithm import llm_guided_clustering
from sidecar.clustering.config import ClusteringConfig
from sidecar.clustering.llm import OpenAIGoalLLM
from sidecar.clustering.metrics import ClusteringMetrics
from sidecar.transcript.model import Message
from tests.clustering.fakes import HashEmbedder, blobs
from tests.support.vllm_server import VllmServer


def value(metrics: ClusteringMetrics, name: str, kind: str) -> float:
    return float(getattr(metrics, name).labels(kind)._value.get())


def make(server: VllmServer, guided: bool) -> tuple[OpenAIGoalLLM, ClusteringMetrics]:
    cfg = ClusteringConfig(
        mode="llm",
        llm={
            "base_url": server.base_url,
            "model": server.base_model,
            "max_tokens": 24,
            "guided_json": guided,
            "request_timeout_seconds": 120,
            "max_concurrency": 2,
        },
    )
    metrics = ClusteringMetrics(CollectorRegistry())
    return OpenAIGoalLLM(cfg, metrics), metrics


async def test_free_text_nonsense_is_survived_and_counted(vllm_server: VllmServer) -> None:
    llm, metrics = make(vllm_server, guided=False)
    try:
        conv = [Message("user", "I want to book a flight to Paris"), Message("assistant", "Sure.")]
        summary = await llm.summarize(conv)
        assert isinstance(summary, str) and summary
        texts, vecs, _ = blobs(groups=2, per_group=6)
        res = await llm_guided_clustering(texts, vecs, llm=llm, embedder=HashEmbedder(), k1=3, examples=3)
    finally:
        await llm.aclose()
    calls = {k: value(metrics, "llm_calls", k) for k in ("summarize", "describe", "merge")}
    invalid = {k: value(metrics, "llm_invalid_answers", k) for k in ("summarize", "describe", "merge")}
    assert calls["summarize"] == 1 and calls["describe"] >= 3 and calls["merge"] >= 1
    assert all(invalid[k] <= calls[k] for k in calls)
    assert sum(invalid.values()) >= 1  # a random model does not write our JSON by chance
    assert value(metrics, "llm_errors", "merge") == 0
    assert 1 <= res.k <= 3 and len(res.labels) == res.k and all(res.labels)
    assert res.stats["merge_queries"] == calls["merge"]


async def test_schema_guided_answers_parse_or_are_counted(vllm_server: VllmServer) -> None:
    llm, metrics = make(vllm_server, guided=True)
    try:
        texts, vecs, _ = blobs(groups=2, per_group=5, seed=4)
        res = await llm_guided_clustering(texts, vecs, llm=llm, embedder=HashEmbedder(), k1=3, examples=2)
    finally:
        await llm.aclose()
    for kind in ("describe", "merge"):
        assert value(metrics, "llm_calls", kind) >= 1
        assert value(metrics, "llm_errors", kind) == 0  # the server accepts response_format json_schema
        assert value(metrics, "llm_invalid_answers", kind) <= value(metrics, "llm_calls", kind)
    assert 1 <= res.k <= 3
    assert np.bincount(res.assignments).tolist() == res.sizes


async def test_live_component_in_llm_mode_survives_the_nonsense(vllm_server: VllmServer) -> None:
    from sidecar.clustering.live import UNKNOWN, GoalClusterer
    from sidecar.contract import TurnContext

    cfg = ClusteringConfig(
        enabled=True,
        mode="llm",
        k1=3,
        examples_per_group=2,
        min_conversations=8,
        reservoir_size=50,
        llm={
            "base_url": vllm_server.base_url,
            "model": vllm_server.base_model,
            "max_tokens": 24,
            "request_timeout_seconds": 120,
            "max_concurrency": 2,
        },
    )
    gc = GoalClusterer(cfg, CollectorRegistry(), embedder=HashEmbedder())
    topics = ["book a flight to Rome", "reserve a table for dinner", "what is the weather"]
    try:
        for i in range(12):
            msgs = (Message("user", f"{topics[i % 3]} number {i}"), Message("assistant", "ok"))
            ctx = TurnContext("conversation_ended", f"c{i}", 1, msgs, None, None, end_reason="end_event")
            assert await gc.goal_label(ctx) == UNKNOWN  # nothing clustered yet
        assert await gc.recluster("manual") is True
        snap = gc.snapshot()
        assert 1 <= len(snap["clusters"]) <= 3
        assert sum(c["size"] for c in snap["clusters"]) == 12
        assert all(c["label"] for c in snap["clusters"] if c["size"] >= cfg.min_conversations_per_name)
        assert all(c["name"] for c in snap["clusters"])
        new = (Message("user", "book a flight to Oslo"),)
        label = await gc.goal_label(TurnContext("conversation_ended", "new", 1, new, None, None))
        assert label in {c["goal"] for c in snap["clusters"]}
    finally:
        await gc.stop()
    assert value(gc.metrics, "llm_calls", "summarize") == 13
    assert value(gc.metrics, "llm_errors", "summarize") == 0


def test_clusters_command_in_llm_mode(vllm_server: VllmServer, tmp_path: Path) -> None:
    from sidecar.cli import main
    from tests.clustering.test_cli import write_dataset

    data = tmp_path / "convs.jsonl.gz"
    write_dataset(data)
    out = tmp_path / "out.json"
    ctx_file = tmp_path / "context.txt"
    ctx_file.write_text("You will see a chat between a user and a travel assistant.")
    rc = main(["clusters", str(data), "--mode", "llm", "--llm-base-url", vllm_server.base_url,
               "--llm-model", vllm_server.base_model, "--k1", "3", "--limit", "9",
               "--context-file", str(ctx_file), "--output", str(out)])  # fmt: skip
    assert rc == 0
    doc = json.loads(out.read_text())
    assert doc["mode"] == "llm" and doc["used"] == 9 and 1 <= doc["k"] <= 3
    calls = doc["llm_calls"]["calls"]
    assert calls["summarize"] == 9 and calls["describe"] >= 3 and calls["merge"] >= 1
    assert "errors" not in doc["llm_calls"] or not any(doc["llm_calls"]["errors"].values())
