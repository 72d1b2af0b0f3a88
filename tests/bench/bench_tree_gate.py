"""Trees where they matter: fully scored turns/s with the tree gate and without, beside the
completion-only rate, and the flagged turns the gate loses, in one run on one vLLM CPU server.

    nice .venv/bin/python -m tests.bench.bench_tree_gate [--conversations 40] [--grow-share 0.3]

The bundled model (``adapters/artifacts``: base + completion adapter) on a real vLLM CPU server,
scored with the demo's configuration (tail window of 256 ids, tree alpha 0.05, depth 24, at most 16
requests), client modes explicit (no self-test in any timed window; ``--exact-logprobs``,
``--mixed-batches``). A *fully scored turn* is what the live hooks do per user turn: a completion
verdict on the adapter and a response tree on the base model, run together (the final verdict
reuses the last turn's, so it costs nothing more). Turns run ``--concurrency`` at a time.

Four sets of the shared dev conversations (MultiWOZ dev, ``$SIDECAR_SHARED_DIR``), disjoint so no
timed pass is served by another's prefix cache:

1. completion only (timed);
2. completion + full tree on every turn (timed);
3. the gate's warm-up: probes only, untimed, until the gate has ``min_signals`` (steady state, as
   a process that has run a while; its one-time cost is printed apart);
4. completion + gated tree (timed); then, untimed, the full tree of each of its turns.

The timed passes 1, 2 and 4 take turns, ``--rounds`` blocks each, so a change in the load of a
shared machine falls on all three alike.

Recall: the live uncertain-turn rule (``alerting.policy.uncertainty``, its defaults: relative,
``best_logprob``, target 5 %, window 500) decides over set 4 in turn order twice, on the full trees
and on what the gate returned (a grown tree, or the probe's greedy branch); lost = turns flagged
with full trees and not with the gate. Both judges start warmed on set 2's full trees, so every
turn of set 4 is decided; also printed at target 10 % and 20 % (more flagged turns to lose).
No assertion: figures and ratios from one run.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from sidecar.alerting.config import UncertaintyPolicyConfig
from sidecar.alerting.policy import UncertaintyJudge
from sidecar.scoring.config import ScoringConfig, TreeGateConfig
from sidecar.scoring.gate import TreeGate, probe_signal
from sidecar.scoring.scorers import Scorers
from sidecar.scoring.tree import ResponseTree, tree_event
from sidecar.tools.demo import models
from sidecar.transcript.model import Message, count_turns, prefix_through_turn
from tests.bench.bench_scoring import load_conversations
from tests.support.tiny_model import TinyModel
from tests.support.vllm_server import ADAPTER_MODEL, VllmServer, running_server

Trees = dict[int, ResponseTree]
Turn = tuple[list[Message], list[Message]]  # (c_k for the verdict, messages through user message k for the tree)


def turns_of(convs: Sequence[Sequence[Message]]) -> list[Turn]:
    out: list[Turn] = []
    for conv in convs:
        for k in range(1, count_turns(conv) + 1):
            ck = prefix_through_turn(conv, k)
            upto = list(ck)
            while upto and upto[-1].role != "user":
                upto.pop()
            if upto:
                out.append((list(ck), upto))
    return out


def scoring_config(server: VllmServer, model: TinyModel, args: argparse.Namespace) -> ScoringConfig:
    cfg = models.demo_scoring_config(server.base_url, model.model_dir, model.adapter_dir)
    cfg["vllm"] |= {
        "max_concurrency": args.max_concurrency,
        "exact_logprobs": args.exact_logprobs,
        "mixed_batches": args.mixed_batches,
    }
    return ScoringConfig(**cfg)


async def timed(turns: Sequence[Turn], concurrency: int, one: Callable[[int, Turn], Awaitable[None]]) -> float:
    """Seconds to run ``one`` over every turn, ``concurrency`` at a time."""
    return await timed_indexed(list(enumerate(turns)), concurrency, one)


async def timed_indexed(
    turns: Sequence[tuple[int, Turn]], concurrency: int, one: Callable[[int, Turn], Awaitable[None]]
) -> float:
    """Seconds to run ``one`` over ``(index, turn)`` pairs, ``concurrency`` at a time."""
    queue = list(turns)
    queue.reverse()

    async def worker() -> None:
        while queue:
            i, turn = queue.pop()
            await one(i, turn)

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return time.perf_counter() - t0


def best_logprob(tree: ResponseTree) -> float | None:
    """What the uncertain-turn rule reads from a tree (the post-score stage's TreeScored)."""
    return tree_event(tree, "base", None).max_logprob


async def run(
    server: VllmServer, model: TinyModel, convs: list[list[Message]], args: argparse.Namespace
) -> dict[str, Any]:
    scorers = Scorers.from_config(scoring_config(server, model, args), CollectorRegistry())
    await scorers.start()
    n = args.conversations
    sets = [turns_of(convs[i * n : (i + 1) * n]) for i in range(3)]
    warm_turns = turns_of(convs[3 * n :])
    base = scorers.config.vllm.base_model
    gate_cfg = TreeGateConfig(mode="cheap_signal", grow_share=args.grow_share, probe_tokens=args.probe_tokens)
    out: dict[str, Any] = {"turns": [len(s) for s in sets]}
    try:
        # Untimed warm-up of the server's code paths for both models (not of these prompts).
        await (await scorers.completion_request(warm_turns[-1][0], ADAPTER_MODEL)).score()
        await (await scorers.tree_request(warm_turns[-1][1], base)).expand()

        async def verdict(turn: Turn) -> None:
            await (await scorers.completion_request(turn[0], ADAPTER_MODEL)).score()

        async def completion_only(_i: int, turn: Turn) -> None:
            await verdict(turn)

        full: dict[int, ResponseTree] = {}

        async def full_turn(i: int, turn: Turn) -> None:
            async def tree() -> None:
                full[i] = await (await scorers.tree_request(turn[1], base)).expand()

            await asyncio.gather(verdict(turn), tree())

        gate = TreeGate(gate_cfg)
        t0 = time.perf_counter()
        warm = 0

        def probe_only(t: ResponseTree) -> bool:
            gate.decide("a", probe_signal(t))
            return False

        for _ck, upto in warm_turns[: gate_cfg.min_signals]:
            await (await scorers.tree_request(upto, base)).expand(probe_tokens=gate_cfg.probe_tokens, grow=probe_only)
            warm += 1
        out["warm_up"] = (warm, time.perf_counter() - t0)

        gated: dict[int, ResponseTree] = {}
        decisions: dict[int, str] = {}

        async def gated_turn(i: int, turn: Turn) -> None:
            async def tree() -> None:
                def grow(t: ResponseTree) -> bool:
                    d = gate.decide("a", probe_signal(t))
                    decisions[i] = d.decision
                    return d.grow

                request = await scorers.tree_request(turn[1], base)
                gated[i] = await request.expand(probe_tokens=gate_cfg.probe_tokens, grow=grow)

            await asyncio.gather(verdict(turn), tree())

        # The three timed passes take turns, a block of each at a time, so a change in the load of
        # a shared machine falls on all three alike.
        seconds = {"completion_s": 0.0, "full_s": 0.0, "gated_s": 0.0}
        passes = (("completion_s", 0, completion_only), ("full_s", 1, full_turn), ("gated_s", 2, gated_turn))
        rounds = args.rounds
        for r in range(rounds):
            for name, k, one in passes:
                block = [(i, t) for i, t in enumerate(sets[k]) if i % rounds == r]
                seconds[name] += await timed_indexed(block, args.concurrency, one)
        out |= seconds
        out["decisions"] = decisions
        out["gated_tokens"] = sum(t.generated_tokens for t in gated.values())
        out["gated_requests"] = sum(t.requests for t in gated.values())
        out["full_tokens"] = sum(t.generated_tokens for t in full.values())
        out["full_requests"] = sum(t.requests for t in full.values())

        reference: dict[int, ResponseTree] = {}

        async def reference_tree(i: int, turn: Turn) -> None:
            reference[i] = await (await scorers.tree_request(turn[1], base)).expand()

        out["reference_s"] = await timed(sets[2], args.concurrency, reference_tree)
        out["recall"] = [recall(full, reference, gated, rate) for rate in (0.05, 0.1, 0.2)]
        out["grown_same_best"] = sum(
            1 for i, t in gated.items() if t.grown and best_logprob(t) == best_logprob(reference[i])
        )
    finally:
        await scorers.stop()
    return out


def recall(warm: Trees, reference: Trees, gated: Trees, target_rate: float) -> dict[str, Any]:
    """Flags of the live rule on full trees vs on the gate's trees, over the same turns in order."""
    policy = UncertaintyPolicyConfig(target_rate=target_rate)
    flags: dict[str, set[int]] = {}
    for name, trees in (("full", reference), ("gated", gated)):
        judge = UncertaintyJudge()
        for i in sorted(warm):
            judge.judge(policy, "a", f"w{i}", warm[i].leaves, best_logprob(warm[i]))
        flags[name] = set()
        for i in sorted(trees):
            if judge.judge(policy, "a", f"t{i}", trees[i].leaves, best_logprob(trees[i])).uncertain:
                flags[name].add(i)
    full, kept = flags["full"], flags["full"] & flags["gated"]
    return {
        "target_rate": target_rate,
        "flagged_full": len(full),
        "flagged_gated": len(flags["gated"]),
        "kept": len(kept),
        "lost": sorted(full - kept),
        "lost_grown": sum(1 for i in full - kept if gated[i].grown),
    }


def report(res: dict[str, Any], args: argparse.Namespace, modes: str) -> None:
    n_c, n_f, n_g = res["turns"]
    completion = n_c / res["completion_s"]
    full = n_f / res["full_s"]
    gated = n_g / res["gated_s"]
    d = list(res["decisions"].values())
    grown = sum(1 for x in d if x != "skipped_confident")
    print(f"modes: {modes}; concurrency {args.concurrency}; gate grow_share {args.grow_share}, "
          f"probe_tokens {args.probe_tokens or 'whole greedy branch'}")  # fmt: skip
    print(f"completion only:            {n_c:4d} turns in {res['completion_s']:6.1f} s = {completion:6.2f} turns/s")
    print(f"completion + full tree:     {n_f:4d} turns in {res['full_s']:6.1f} s = {full:6.2f} turns/s "
          f"({full / completion:.2f}x completion-only; {res['full_requests'] / n_f:.2f} tree requests, "
          f"{res['full_tokens'] / n_f:.1f} tree tokens per turn)")  # fmt: skip
    print(f"completion + gated tree:    {n_g:4d} turns in {res['gated_s']:6.1f} s = {gated:6.2f} turns/s "
          f"({gated / completion:.2f}x completion-only, {gated / full:.2f}x full trees; "
          f"{res['gated_requests'] / n_g:.2f} tree requests, "
          f"{res['gated_tokens'] / n_g:.1f} tree tokens per turn)")  # fmt: skip
    print(f"  trees grown: {grown} of {len(d)} ({grown / max(1, len(d)):.0%}), "
          f"{res['grown_same_best']} of them with the full tree's best logprob; "
          f"gate warm-up (untimed, once): {res['warm_up'][0]} probes in {res['warm_up'][1]:.1f} s")  # fmt: skip
    for r in res["recall"]:
        lost = len(r["lost"])
        tag = " (the default)" if r["target_rate"] == 0.05 else ""
        print(f"flagged turns, rule best_logprob at target {r['target_rate']:.0%}{tag}, {n_g} turns: "
              f"full trees {r['flagged_full']}, gated {r['flagged_gated']}, kept {r['kept']}, lost {lost} "
              f"({lost / max(1, r['flagged_full']):.1%}; {r['lost_grown']} of them grown)")  # fmt: skip
    r = res["recall"][0]
    print(f"target: gated >= 0.5x completion-only: {gated / completion:.2f}x; lost <= 5 %: "
          f"{len(r['lost']) / max(1, r['flagged_full']):.1%}")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--conversations", type=int, default=40, help="per timed set (three sets, plus the warm-up)")
    p.add_argument("--max-turns", type=int, default=8)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--rounds", type=int, default=4, help="blocks per timed pass, taken in turn")
    p.add_argument("--max-concurrency", type=int, default=16, help="the client's requests in flight")
    p.add_argument("--grow-share", type=float, default=TreeGateConfig().grow_share)
    p.add_argument("--probe-tokens", type=int, default=None)
    p.add_argument("--exact-logprobs", default="off", choices=["shared", "isolated", "off"])
    p.add_argument("--mixed-batches", default="separated", choices=["shared", "separated"])
    args = p.parse_args(argv)
    found = models.bundled_model()
    if found is None:
        raise SystemExit("the bundled model is not in adapters/artifacts")
    model = TinyModel(found[0], found[1], found[0] / "tokenizer.json")
    convs = load_conversations(3 * args.conversations + 20, args.max_turns)
    modes = f"exact_logprobs {args.exact_logprobs}, mixed_batches {args.mixed_batches}"
    with tempfile.TemporaryDirectory(prefix="bench-tree-gate-") as tmp:
        print(f"model: bundled ({model.model_dir.name} + {model.adapter_dir.name}); starting vLLM", flush=True)
        with running_server(model, Path(tmp) / "vllm.log") as server:
            res = asyncio.run(run(server, model, convs, args))
    report(res, args, modes)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
