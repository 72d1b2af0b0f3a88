"""Algorithm 1 with a real model: Gemma 3 270M base writes the goal summaries, names and merges.

Usage (from the repository root; needs the shared datasets and the vLLM CPU venv)::

    nice -n 10 .venv/bin/python -m tests.bench.bench_gemma_goals \\
        [--datasets sgd multiwoz star] [--per-dataset 60] [--k1 10] [--out build/bench-gemma-goals]

Per dataset, the seeded sample of ``tests.bench.bench_clustering`` (its first ``--per-dataset``
conversations) is clustered twice with the sidecar's own code (``cluster_conversations``, local
all-MiniLM-L6-v2 embeddings, the same ``k1`` and seed):

- **extractive**: the LLM-free mode (summaries are the users' own messages, keyword names,
  similarity merges), as the sidecar runs without an instruct model;
- **gemma**: mode ``llm`` with the Gemma base, served as in ``tests.bench.gemma_chat`` (a *base*
  model prompted with the paper's instruct prompts, JSON-schema guided decoding): it summarises
  every conversation (paper App. B.1), describes every cluster and decides every merge.

Measured: the share of clusters whose published name contains a key term of the cluster's
majority label (``tests.bench.bench_goal_names``'s measure), the adjusted Rand index against the
labels, the number of clusters, the model's calls and answers that were not valid JSON of the
asked schema (each falls back to the extractive default, as in the sidecar), and seconds. The
labels are read from ``meta`` for scoring only. Writes ``results.json`` and ``results.md`` (the
table and, per dataset, example summaries and names) to ``--out``.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
from prometheus_client import CollectorRegistry

from sidecar.clustering.config import ClusteringConfig
from sidecar.clustering.embed import SentenceTransformerEmbedder
from sidecar.clustering.llm import ExtractiveGoalLLM, GoalLLM, OpenAIGoalLLM
from sidecar.clustering.metrics import ClusteringMetrics
from sidecar.tools.clustering.evaluation import adjusted_rand_index
from sidecar.tools.clustering.offline import cluster_conversations
from sidecar.tools.demo import models
from sidecar.transcript.dataset import InvalidRecord, parse_line
from sidecar.transcript.model import Message
from tests.bench.bench_clustering import GOALS, shared_dir
from tests.bench.bench_goal_names import hit, published
from tests.bench.gemma_chat import REQUEST_TIMEOUT_SECONDS, chat_server

DATASETS = ("sgd", "multiwoz", "star")
# One worked example in ``llm.application_context`` (the paragraph the summary prompt starts with),
# from a domain none of the datasets has. Zero-shot, the base model answered "high-level intent",
# the prompt's own words, for 10 of 12 SGD conversations (a smoke run with --zero-shot).
FEW_SHOT = (
    "Example. [INPUT LOG] user: hi, my inhaler prescription ran out, can you refill it? assistant: Sure, "
    "which pharmacy? user: the one on Main Street, I'll pick it up tomorrow. Answer: "
    '{"intent": "The user\'s high-level intent is to refill an inhaler prescription for pickup at a pharmacy."}'
)
# Words of the worked example that no dataset's goals need: a summary holding one repeats the example.
ECHO_WORDS = ("inhaler", "pharmacy", "prescription")


def load(name: str, n: int, seed: int = 0) -> tuple[list[list[Message]], list[str | None]]:
    """The first ``n`` of ``bench_clustering``'s seeded sample: transcripts and known goals."""
    with gzip.open(shared_dir() / "datasets" / name / "dev.jsonl.gz", "rb") as fh:
        lines = fh.readlines()
    pick = sorted(np.random.default_rng(seed).permutation(len(lines))[: min(n, len(lines))].tolist())
    transcripts: list[list[Message]] = []
    goals: list[str | None] = []
    for i in pick:
        try:
            conv = parse_line(lines[i])
        except InvalidRecord:
            continue
        transcripts.append(list(conv.messages))
        goals.append(GOALS[name][1](json.loads(lines[i])))
    return transcripts, goals


def counts(metrics: ClusteringMetrics, counter: str) -> dict[str, int]:
    """A labelled counter's values by prompt kind."""
    out: dict[str, int] = {}
    for metric in getattr(metrics, counter).collect():
        for sample in metric.samples:
            if sample.name.endswith("_total"):
                out[sample.labels["kind"]] = int(sample.value)
    return out


async def run_mode(
    llm: GoalLLM, transcripts: list[list[Message]], goals: list[str | None], cfg: ClusteringConfig, concurrency: int
) -> dict[str, Any]:
    began = time.monotonic()
    gate = asyncio.Semaphore(concurrency)

    async def summarize(t: list[Message]) -> str:
        async with gate:
            return await llm.summarize(t)

    summaries = list(await asyncio.gather(*(summarize(t) for t in transcripts)))
    summarized = time.monotonic() - began
    embedder = SentenceTransformerEmbedder()
    vectors = await asyncio.to_thread(embedder.embed, summaries)
    res = await cluster_conversations(summaries, vectors, cfg, llm, embedder, seed=cfg.seed)
    rows: list[dict[str, Any]] = []
    for c in range(res.k):
        members = [goals[i] for i in np.flatnonzero(res.assignments == c) if goals[i] is not None]
        majority = Counter(members).most_common(1)[0][0] if members else None
        name = published(res.labels[c], res.sizes[c], cfg)
        rows.append({"size": res.sizes[c], "majority": majority, "name": name, "label": res.labels[c],
                     "hit": hit(name, majority)})  # fmt: skip
    known = [i for i, g in enumerate(goals) if g is not None]
    return {
        "k": res.k,
        "name_has_key_term": sum(bool(r["hit"]) for r in rows) / max(1, len(rows)),
        "ari": adjusted_rand_index([goals[i] for i in known], res.assignments[known]),
        "seconds": {"summaries": round(summarized, 1), "total": round(time.monotonic() - began, 1)},
        "algorithm": {k: v for k, v in res.stats.items() if isinstance(v, int | float | str)},
        "summaries": summaries,
        "clusters": sorted(rows, key=lambda r: -r["size"]),
    }


async def one_dataset(name: str, args: argparse.Namespace, base_url: str) -> dict[str, Any]:
    transcripts, goals = load(name, args.per_dataset)
    common = {"k1": args.k1, "max_merge_queries": args.max_merge_queries}
    extractive_cfg = ClusteringConfig.model_validate({**common, "mode": "extractive"})
    llm_cfg = ClusteringConfig.model_validate(
        {
            **common,
            "mode": "llm",
            "llm": {
                "base_url": base_url,
                "model": "base",
                "max_tokens": args.max_tokens,
                "request_timeout_seconds": REQUEST_TIMEOUT_SECONDS,
                "application_context": "" if args.zero_shot else FEW_SHOT,
            },
        }
    )
    out: dict[str, Any] = {"dataset": name, "n": len(transcripts), "goal_field": GOALS[name][0]}
    out["extractive"] = await run_mode(ExtractiveGoalLLM(extractive_cfg), transcripts, goals, extractive_cfg, 4)
    metrics = ClusteringMetrics(CollectorRegistry())
    gemma = OpenAIGoalLLM(llm_cfg, metrics)
    try:
        out["gemma"] = await run_mode(gemma, transcripts, goals, llm_cfg, args.concurrency)
    finally:
        await gemma.aclose()
    out["gemma"]["calls"] = counts(metrics, "llm_calls")
    out["gemma"]["invalid_answers"] = counts(metrics, "llm_invalid_answers")
    print(f"{name}: done", file=sys.stderr)
    return out


def markdown(results: list[dict[str, Any]], command: str, examples: int) -> str:
    lines = [
        "# Goal clustering with Gemma 3 270M base vs LLM-free (generated)",
        "",
        f"Command: `{command}`",
        "",
        "The Gemma model is a base model, not instruction-tuned, prompted with the paper's prompts"
        + ("." if "--zero-shot" in command else " and one worked example before the summary prompt."),
        "",
        "| dataset | n | mode | clusters | name has a key term | ARI | LLM calls | invalid answers "
        "| merges / merge queries | summaries echoing the example | seconds |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        for mode in ("extractive", "gemma"):
            m = r[mode]
            calls = sum(m.get("calls", {}).values())
            bad = m.get("invalid_answers", {})
            shown_bad = ", ".join(f"{k} {v}" for k, v in sorted(bad.items()) if v) or ("0" if calls else "-")
            algo = m.get("algorithm", {})
            echo = sum(any(w in s.lower() for w in ECHO_WORDS) for s in m["summaries"])
            lines.append(
                f"| {r['dataset']} | {r['n']} | {mode} | {m['k']} | {m['name_has_key_term']:.0%} | {m['ari']:.3f} "
                f"| {calls or '-'} | {shown_bad} | {algo.get('merges', '-')} / {algo.get('merge_queries', '-')} "
                f"| {echo} | {m['seconds']['total']:.0f} |"
            )
    for r in results:
        lines += ["", f"## {r['dataset']}: summaries of the first conversations", ""]
        lines += ["| extractive | gemma |", "|---|---|"]
        for a, b in list(zip(r["extractive"]["summaries"], r["gemma"]["summaries"], strict=True))[:examples]:
            lines.append(f"| {a.replace('|', '/')} | {b.replace('|', '/')} |")
        lines += ["", f"## {r['dataset']}: the largest clusters' names", ""]
        for mode in ("extractive", "gemma"):
            lines.append(f"- {mode}: " + "; ".join(
                f"{c['size']} x {c['majority']} -> \"{c['name']}\"" for c in r[mode]["clusters"][:examples]
            ))  # fmt: skip
    return "\n".join(lines) + "\n"


async def run(args: argparse.Namespace, base_url: str) -> list[dict[str, Any]]:
    return [await one_dataset(d, args, base_url) for d in args.datasets]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--datasets", nargs="+", default=list(DATASETS), choices=DATASETS)
    p.add_argument("--per-dataset", type=int, default=60)
    p.add_argument("--k1", type=int, default=10)
    p.add_argument("--max-merge-queries", type=int, default=60)
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--examples", type=int, default=6)
    p.add_argument("--zero-shot", action="store_true", help="no worked example before the summary prompt")
    p.add_argument("--out", type=Path, default=Path("build/bench-gemma-goals"))
    args = p.parse_args(argv)
    if not (shared_dir() / "datasets").is_dir():
        print(f"no datasets under {shared_dir()} (set SIDECAR_SHARED_DIR)", file=sys.stderr)
        return 2
    server = chat_server(models.gemma_base(), args.out)
    server.start()
    try:
        server.wait_ready_blocking(600)
        results = asyncio.run(run(args, server.base_url))
    finally:
        server.stop()
    command = " ".join(["python -m tests.bench.bench_gemma_goals", *sys.argv[1:]])
    (args.out / "results.json").write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    text = markdown(results, command, args.examples)
    (args.out / "results.md").write_text(text, encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
