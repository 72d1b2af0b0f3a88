"""Response-tree statistics and the uncertain-turn rate on real conversations, through the sidecar's
own tree path (the ``Scorers`` that ``ScoringHooks.on_user_message`` expands trees with) on a real
vLLM server with the bundled model.

For each alpha it prints the distribution of leaves and of the best-branch logprob (how
degenerate the trees are), the cost in generated tokens, and the rate at which the post-score
stage's uncertainty policy flags turns (relative mode at the configured target, and the old fixed
thresholds), so the figures in the README can be reproduced:

    .venv/bin/python -m tests.bench.bench_tree_stats --conversations 100 --alphas 0.1,0.05,0.02

With ``--url`` it uses a running server (serving the bundled model as ``sidecar demo`` does);
otherwise it starts one.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from prometheus_client import CollectorRegistry

from sidecar.alerting.config import UncertaintyPolicyConfig
from sidecar.alerting.policy import UncertaintyJudge
from sidecar.contract import TreeScored, TurnContext
from sidecar.scoring.scorers import Scorers
from sidecar.tools.demo import models
from sidecar.tools.demo.replay import load_sample
from sidecar.transcript.model import Message
from tests.support.bundled_vllm import BundledVllm


def user_turns(n_conversations: int) -> list[TurnContext]:
    out = []
    for rec in load_sample()[:n_conversations]:
        msgs: list[Message] = []
        turn = 0
        for t in rec["turns"]:
            msgs.append(Message(t["role"], t.get("content") or ""))
            if t["role"] == "user":
                turn += 1
                out.append(TurnContext("user_message", rec["conversation_id"], turn, tuple(msgs), "bench", None))
    return out


def pct(values: list[float], qs: tuple[int, ...] = (10, 50, 90)) -> list[float]:
    return [round(float(np.percentile(values, q)), 2) for q in qs] if values else []


async def trees(server: BundledVllm, alpha: float, turns: list[TurnContext], depth: int) -> list[TreeScored]:
    cfg = server.scoring_config(
        tree={
            "alpha": alpha,
            "max_depth_tokens": depth,
            "max_requests": 16,
            "max_staleness_seconds": 0,
            "skip_superseded": False,
        }
    )
    scorers = Scorers.from_config(cfg, CollectorRegistry())

    async def one(t: TurnContext) -> TreeScored:
        request = await scorers.tree_request(t.messages, scorers.tree_model(t.agent))
        tree = await request.expand()
        return scorers.tree_scored(tree, request.model, scorers.best_branch_text(tree))

    await scorers.start()
    try:
        results: list[TreeScored] = []
        for i in range(0, len(turns), 8):
            results.extend(await asyncio.gather(*(one(t) for t in turns[i : i + 8])))
        return results
    finally:
        await scorers.stop()


def rates(found: list[TreeScored], turns: list[TurnContext], target: float) -> dict[str, float]:
    relative = UncertaintyPolicyConfig(target_rate=target, window_trees=500, min_trees=50)
    fixed = UncertaintyPolicyConfig(mode="fixed")
    judge = UncertaintyJudge()
    flags_rel = [
        judge.judge(relative, "bench", f"{t.conversation_id}:{t.turn}", e.leaves, e.max_logprob).uncertain
        for e, t in zip(found, turns, strict=True)
    ][relative.min_trees :]
    flags_fixed = [UncertaintyJudge().judge(fixed, "x", "k", e.leaves, e.max_logprob).uncertain for e in found]
    return {
        "relative_rate": round(sum(flags_rel) / max(1, len(flags_rel)), 4),
        "fixed_rate": round(sum(flags_fixed) / max(1, len(flags_fixed)), 4),
    }


async def main(args: argparse.Namespace) -> dict[str, Any]:
    turns = user_turns(args.conversations)
    report: dict[str, Any] = {"turns": len(turns), "target_rate": args.target, "depth_tokens": args.depth, "alphas": {}}
    server = None
    if args.url:
        bundled = BundledVllm(args.url.rstrip("/"))
    else:
        server = models.local_server(Path(tempfile.mkdtemp()) / "vllm.log")
        server.start()
        await server.wait_ready()
        bundled = BundledVllm(server.root_url)
    try:
        for alpha in args.alphas:
            t0 = time.monotonic()
            found = await trees(bundled, alpha, turns, args.depth)
            leaves = [e.leaves for e in found]
            best = [e.max_logprob for e in found if e.max_logprob is not None]
            report["alphas"][str(alpha)] = {
                "trees": len(found),
                "one_leaf_share": round(sum(x == 1 for x in leaves) / len(leaves), 3),
                "leaves_p10_p50_p90": pct([float(x) for x in leaves]),
                "leaves_max": max(leaves),
                "best_logprob_p10_p50_p90": pct(best),
                "mean_token_logprob_p50": round(
                    statistics.median(e.mean_token_logprob for e in found if e.mean_token_logprob is not None), 3
                ),
                "generated_tokens_p50": statistics.median(e.generated_tokens for e in found),
                "budget_hit_share": round(sum(e.budget_hit is not None for e in found) / len(found), 3),
                "seconds": round(time.monotonic() - t0, 1),
                **rates(found, turns, args.target),
            }
            print(json.dumps({alpha: report["alphas"][str(alpha)]}), file=sys.stderr, flush=True)
    finally:
        if server is not None:
            server.stop()
    return report


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--conversations", type=int, default=100)
    p.add_argument("--alphas", type=lambda s: [float(x) for x in s.split(",")], default=[0.1, 0.05, 0.02])
    p.add_argument("--depth", type=int, default=24)
    p.add_argument("--target", type=float, default=0.05)
    p.add_argument("--url", default=None, help="root URL of a running server with the bundled model")
    p.add_argument("--out", type=Path, default=None, help="write the report JSON here")
    return p.parse_args(argv)


if __name__ == "__main__":
    a = parse()
    result = asyncio.run(main(a))
    text = json.dumps(result, indent=2)
    print(text)
    if a.out is not None:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(text + "\n", encoding="utf-8")
