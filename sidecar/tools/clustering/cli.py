"""``sidecar clusters``: Algorithm 1 on a JSONL file of conversations, offline.

Prints one JSON document: ``k``, the cluster labels and sizes, every conversation's cluster, the
run's LLM-call counts, and, on request, a stability check (a second run with another seed and a
shuffled input order: adjusted Rand index and the aligned confusion matrix of the paper's
Figure 4, optionally plotted), Table-4-style train/test distances, and the ARI against a known
goal field of the input (read for scoring only, never shown to the summariser).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from prometheus_client import CollectorRegistry

from sidecar.clustering.algorithm import ClusteringResult, assign_nearest
from sidecar.clustering.config import ClusteringConfig
from sidecar.clustering.embed import Embedder, Matrix, build_embedder
from sidecar.clustering.llm import ExtractiveGoalLLM, GoalLLM, OpenAIGoalLLM
from sidecar.clustering.metrics import ClusteringMetrics
from sidecar.errors import ConfigError, SidecarError
from sidecar.tools.clustering.evaluation import (
    adjusted_rand_index,
    aligned_confusion,
    diagonal_fraction,
    mean_distance,
    plot_confusion,
)
from sidecar.tools.clustering.offline import (
    Conversation,
    ReadStats,
    cluster_conversations,
    iter_conversations,
    summarize_all,
)

EXIT_OK, EXIT_FAILURE, EXIT_USAGE = 0, 1, 2


def add_clusters_parser(subparsers: Any) -> None:
    """Register the ``clusters`` subcommand on the root parser's subparsers."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "clusters",
        help="cluster user goals in a JSONL file of conversations (Algorithm 1)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("input", type=Path, help="JSONL(.gz) file, one conversation per line")
    p.add_argument(
        "--config",
        type=Path,
        default=None,
        metavar="FILE",
        help="YAML configuration file; its clustering section is used",
    )
    p.add_argument(
        "--mode",
        choices=["llm", "extractive"],
        default=None,
        help="override clustering.mode (extractive = LLM-free, weaker)",
    )
    p.add_argument("--k1", type=int, default=None, help="override clustering.k1")
    p.add_argument("--seed", type=int, default=None, help="override clustering.seed")
    p.add_argument("--limit", type=int, default=None, help="use at most N conversations")
    p.add_argument(
        "--sample-seed",
        type=int,
        default=0,
        help="with --limit: pick a random subset with this seed (default: the first N)",
    )
    p.add_argument("--llm-base-url", default=None, help="override clustering.llm.base_url")
    p.add_argument("--llm-model", default=None, help="override clustering.llm.model")
    p.add_argument(
        "--context-file", type=Path, default=None, help="application context paragraph for the summary prompt"
    )
    p.add_argument(
        "--goal-field",
        default=None,
        metavar="DOTTED",
        help="known goal of each record (e.g. domain, meta.tasks.0): report ARI against it",
    )
    p.add_argument(
        "--stability",
        action="store_true",
        help="second run with seed+1 and a shuffled order: ARI and aligned confusion matrix",
    )
    p.add_argument("--plot", type=Path, default=None, help="with --stability: write Figure 4 as PNG")
    p.add_argument(
        "--split", action="store_true", help="Table 4: cluster a random 50%%, assign the rest, report mean distances"
    )
    p.add_argument("--output", type=Path, default=None, help="write the JSON here instead of stdout")
    p.set_defaults(handler=run_clusters_command)


def _config(args: argparse.Namespace) -> ClusteringConfig:
    from sidecar.config import load_config

    base = load_config(args.config).clustering.model_dump()
    over: dict[str, Any] = {}
    for key in ("mode", "k1", "seed"):
        if getattr(args, key) is not None:
            over[key] = getattr(args, key)
    llm = dict(base["llm"])
    if args.llm_base_url:
        llm["base_url"] = args.llm_base_url
    if args.llm_model:
        llm["model"] = args.llm_model
    if args.context_file is not None:
        try:
            llm["application_context"] = args.context_file.read_text(encoding="utf-8")[:4000]
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"cannot read context file {args.context_file}: {exc}") from exc
    try:
        return ClusteringConfig.model_validate({**base, **over, "llm": llm})
    except ValueError as exc:
        raise ConfigError(f"invalid clustering options: {exc}") from exc


def load_input(
    path: Path, goal_field: str | None, limit: int | None, sample_seed: int
) -> tuple[list[Conversation], ReadStats]:
    """The conversations to cluster (all, the first N, or a seeded random N)."""
    if not path.is_file():
        raise ConfigError(f"input file {path} does not exist")
    stats = ReadStats()
    convs = list(iter_conversations(path, goal_field, stats))
    if limit is not None and limit < len(convs):
        if sample_seed:
            pick = sorted(np.random.default_rng(sample_seed).choice(len(convs), limit, replace=False))
            convs = [convs[int(i)] for i in pick]
        else:
            convs = convs[:limit]
    return convs, stats


def _result_json(res: ClusteringResult, ids: list[str]) -> dict[str, Any]:
    return {
        "k": res.k,
        "clusters": [{"cluster": c, "label": res.labels[c], "size": res.sizes[c]} for c in range(res.k)],
        "assignments": dict(zip(ids, res.assignments.tolist(), strict=True)),
        "stats": res.stats,
    }


@dataclass(frozen=True, slots=True)
class _Tools:
    cfg: ClusteringConfig
    llm: GoalLLM
    embedder: Embedder
    metrics: ClusteringMetrics


async def _evaluate(args: argparse.Namespace, tools: _Tools, convs: list[Conversation]) -> dict[str, Any]:
    cfg, llm, embedder = tools.cfg, tools.llm, tools.embedder
    t0 = time.perf_counter()
    summaries = await summarize_all(convs, llm, concurrency=cfg.llm.max_concurrency)
    t1 = time.perf_counter()
    vectors: Matrix = await asyncio.to_thread(embedder.embed, summaries)
    t2 = time.perf_counter()
    res = await cluster_conversations(summaries, vectors, cfg, llm, embedder, seed=cfg.seed)
    t3 = time.perf_counter()
    out = _result_json(res, [c.conversation_id for c in convs])
    out["seconds"] = {"summaries": round(t1 - t0, 3), "embeddings": round(t2 - t1, 3), "clustering": round(t3 - t2, 3)}
    goals = [c.goal for c in convs]
    if args.goal_field:
        known = [i for i, g in enumerate(goals) if g is not None]
        out["goal_ari"] = adjusted_rand_index([goals[i] for i in known], res.assignments[known])
        out["goal_distinct"] = len({goals[i] for i in known})
    if args.stability:
        res2 = await cluster_conversations(
            summaries, vectors, cfg, llm, embedder, seed=cfg.seed + 1, order_seed=cfg.seed + 1
        )
        mat, _, _ = aligned_confusion(res.assignments, res2.assignments)
        out["stability"] = {
            "ari": adjusted_rand_index(res.assignments, res2.assignments),
            "k_run2": res2.k,
            "diagonal_fraction": diagonal_fraction(mat),
            "confusion": mat.tolist(),
        }
        if args.plot is not None:
            plot_confusion(mat, f"{args.input.name}: run 1 vs run 2", str(args.plot))
    if args.split:
        out["table4"] = await _table4(summaries, vectors, tools, res)
    out["llm_calls"] = _calls(tools.metrics)
    return out


async def _table4(summaries: list[str], vectors: Matrix, tools: _Tools, full: ClusteringResult) -> dict[str, Any]:
    cfg = tools.cfg
    n = len(summaries)
    perm = np.random.default_rng(cfg.seed).permutation(n)
    tr, te = np.sort(perm[: n // 2]), np.sort(perm[n // 2 :])
    res = await cluster_conversations(
        [summaries[i] for i in tr], vectors[tr], cfg, tools.llm, tools.embedder, seed=cfg.seed
    )
    _, test_dist = assign_nearest(vectors[te], res.centroids)
    return {
        "clusters_train": res.k,
        "distance_train": mean_distance(vectors[tr], res.assignments, res.centroids),
        "distance_test": float(test_dist.mean()) if len(te) else None,
        "clusters_full": full.k,
        "distance_full": mean_distance(vectors, full.assignments, full.centroids),
    }


def _calls(metrics: ClusteringMetrics) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for family, name in (
        (metrics.llm_calls, "calls"),
        (metrics.llm_invalid_answers, "invalid"),
        (metrics.llm_errors, "errors"),
    ):
        for metric in family.collect():
            for sample in metric.samples:
                if sample.name.endswith("_total"):
                    out.setdefault(name, {})[sample.labels["kind"]] = sample.value
    return out


def run_clusters_command(args: argparse.Namespace) -> int:
    """Handler of ``sidecar clusters``: exit 0 on success, 1 on a backend failure, 2 on bad usage."""
    cfg = _config(args)
    if args.limit is not None and args.limit < 2:
        raise ConfigError("--limit must be at least 2")
    convs, stats = load_input(args.input, args.goal_field, args.limit, args.sample_seed)
    if len(convs) < 2:
        raise ConfigError(f"{args.input}: fewer than 2 valid conversations (skipped: {stats.skipped})")
    metrics = ClusteringMetrics(CollectorRegistry())
    llm: GoalLLM = OpenAIGoalLLM(cfg, metrics) if cfg.mode == "llm" else ExtractiveGoalLLM(cfg)
    embedder = build_embedder(cfg.embedding)

    async def main() -> dict[str, Any]:
        try:
            return await _evaluate(args, _Tools(cfg, llm, embedder, metrics), convs)
        finally:
            if isinstance(llm, OpenAIGoalLLM):
                await llm.aclose()

    try:
        out = asyncio.run(main())
    except SidecarError as exc:
        if isinstance(exc, ConfigError):
            raise
        print(f"sidecar clusters: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    out = {
        "input": str(args.input),
        "mode": cfg.mode,
        "read": stats.records,
        "skipped": stats.skipped,
        "used": len(convs),
        **out,
    }
    text = json.dumps(out, indent=1, ensure_ascii=False)
    if args.output is not None:
        args.output.write_text(text + "\n", encoding="utf-8")
    else:
        sys.stdout.write(text + "\n")
    print(
        f"k={out['k']} from {len(convs)} conversations ({stats.records} read, skipped {stats.skipped})", file=sys.stderr
    )
    return EXIT_OK
