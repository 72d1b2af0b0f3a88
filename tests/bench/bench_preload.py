"""Paired benchmark: the CPU vLLM server with and without tcmalloc and Intel OpenMP preloaded.

The launcher (``sidecar/tools/local_vllm.py``) preloads both where present. This run starts the
same server both ways, in ABBA order (without, with, with, without by default) so that a machine
that slows down or speeds up during the run weighs on both sides alike, and gives each the same
work on a fresh server: warm-up and self-tests first (not timed), then the completion scorer after
every turn of the same conversations at concurrency 1 and 16, and response trees. Prints each
start's figures and the ratio with / without of the summed times. No assertions.

    nice -n 10 .venv/bin/python -m tests.bench.bench_preload [--conversations 8] [--trees 4] [--rounds 1]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from sidecar.tools.local_vllm import preload_libraries, vllm_python
from sidecar.transcript.tokenize import SafeTokenizer
from tests.bench.bench_scoring import (
    bench_trees,
    load_conversations,
    resolve_model,
    resolve_modes,
    score_all_turns,
)
from tests.support.vllm_server import VllmServer, running_server


async def workload(server: VllmServer, tok: SafeTokenizer, convs: Any, args: argparse.Namespace) -> dict[str, Any]:
    modes, _ = await resolve_modes(server, tok, "auto", "auto")
    out: dict[str, Any] = {"modes": modes.describe()}
    for c in (1, 16):
        res = await score_all_turns(server, tok, convs, modes, concurrency=c)
        out[f"c{c}"] = (res["turns"], res["seconds"])
    t0 = time.perf_counter()
    trees = await bench_trees(server, tok, convs, args.trees, 0.05, 32, modes)
    out["trees"] = (trees["trees"], time.perf_counter() - t0, trees["fast_generated_vllm"])
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--conversations", type=int, default=8)
    p.add_argument("--max-turns", type=int, default=8)
    p.add_argument("--trees", type=int, default=4, help="tree prompts per served model")
    p.add_argument("--rounds", type=int, default=1, help="ABBA rounds (each: 4 server starts)")
    p.add_argument("--model-dir")
    p.add_argument("--adapter-dir")
    args = p.parse_args(argv)
    found = preload_libraries(vllm_python())
    print("preload: " + ", ".join(f"{k} {v if v is not None else 'ABSENT (run without it)'}" for k, v in found.items()))
    if all(v is None for v in found.values()):
        print("neither library is present: both sides would be the same server", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="bench-preload-") as tmp:
        root = Path(tmp)
        model, origin = resolve_model(args, root / "model")
        print(f"model: {origin}: {model.model_dir.name} + {model.adapter_dir.name}", flush=True)
        tok = SafeTokenizer.from_model_dir(model.model_dir)
        convs = load_conversations(args.conversations, args.max_turns)
        runs: dict[bool, list[dict[str, Any]]] = {False: [], True: []}
        order = [False, True, True, False] * args.rounds
        for i, preload in enumerate(order):
            t0 = time.perf_counter()
            with running_server(model, root / f"vllm-{i}.log", preload=preload) as server:
                started = time.perf_counter() - t0
                res = asyncio.run(workload(server, tok, convs, args))
            res["start"] = started
            runs[preload].append(res)
            print(
                f"  {'with   ' if preload else 'without'} preload: start {started:.1f}s; "
                f"c1 {res['c1'][0] / res['c1'][1]:.2f} turns/s, c16 {res['c16'][0] / res['c16'][1]:.2f} turns/s, "
                f"{res['trees'][0]} trees in {res['trees'][1]:.1f}s ({res['modes']})",
                flush=True,
            )
    report(runs)
    return 0


def report(runs: dict[bool, list[dict[str, Any]]]) -> None:
    def total(preload: bool, key: str) -> tuple[float, float]:
        rs = runs[preload]
        if key == "start":
            return float(len(rs)), sum(r["start"] for r in rs)
        return float(sum(r[key][0] for r in rs)), sum(r[key][1] for r in rs)

    print("\nwith / without preload, summed over the starts of each side (rate ratio > 1: preload faster):")
    for key, unit in (("c1", "turns/s"), ("c16", "turns/s"), ("trees", "trees/s"), ("start", "starts/s")):
        (n0, s0), (n1, s1) = total(False, key), total(True, key)
        r0, r1 = n0 / s0, n1 / s1
        print(f"  {key:>5}: without {r0:.3f} {unit}, with {r1:.3f} {unit}; ratio {r1 / r0:.3f}")
    sys.stdout.flush()


if __name__ == "__main__":
    raise SystemExit(main())
