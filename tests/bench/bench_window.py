"""Prompt windows past the adapter's context: prefill cost and accuracy of 'tail' against 'stride'.

The bundled adapter reads the last 256 ids of the whole rendering (``prompt_truncation: tail``).
Past 256 ids that window moves with every turn, so the server's prefix cache cannot help and
every scored turn prefills the whole window again. ``stride`` windows start at a multiple of the
stride instead, so successive turns share their prefix until the start moves.

(1) Prefill: long MultiWOZ dev conversations (full rendering longer than the window), completion
    scored after every turn at concurrency 1 on a real vLLM CPU server with the bundled base and
    adapter; prefill computed = vLLM's prompt tokens - prefix-cache hits (its /metrics), divided by
    the final conversations' whole-rendering tokens. Each mode gets its own conversations (a cold
    cache), the same number of each.
(2) Accuracy: the adapters' held-out test side (paper protocol), scored in process with peft on
    the ids each mode's sidecar prompt builder sends; F1 (complete) by the greedy rule and ROC-AUC
    of P(end), per data set.

    .venv/bin/python -m tests.bench.bench_window [--strides 64,128,192] [--conversations 24]

Needs the shared corpora (``SIDECAR_SHARED_DIR``) and ``adapters prepare`` data (made if missing).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from adapters.data.conversations import messages_from_json
from adapters.evaluation.metrics import binary_metrics
from adapters.evaluation.validate import load_model, next_token_probs
from adapters.serving.manifest import message_cap
from sidecar.scoring.client import VllmClient
from sidecar.scoring.config import VllmEndpointConfig
from sidecar.scoring.prompts import PromptBuilder
from sidecar.transcript.model import Message, count_turns, prefix_through_turn
from sidecar.transcript.tokenize import SafeTokenizer
from tests.bench.bench_scoring import delta, load_conversations, vllm_counters
from tests.support.tiny_model import END_TAG, TinyModel
from tests.support.vllm_server import running_server

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "adapters" / "artifacts"
DATA = REPO / "build" / "adapters" / "data1000"


def builder(tok: SafeTokenizer, window: int, stride: int | None, cap: int | None) -> PromptBuilder:
    return PromptBuilder(
        tok,
        end_tag=END_TAG,
        instruct_prompt="x",
        max_prompt_tokens=window,
        tail_truncation=True,
        stride_tokens=stride,
        max_message_tokens=cap,
    )


def modes(window: int, strides: list[int], short: list[int]) -> list[tuple[str, int, int | None]]:
    """(name, window, stride): tail at the adapter's window, stride windows, and shorter plain tails
    (is a shorter window what hurts, or where it starts?)."""
    out: list[tuple[str, int, int | None]] = [("tail", window, None)]
    out += [(f"stride {s}", window, s) for s in strides]
    return out + [(f"tail {w}", w, None) for w in short]


async def prefill(server: Any, b: PromptBuilder, whole: PromptBuilder, convs: list[list[Message]]) -> dict[str, Any]:
    client = VllmClient(VllmEndpointConfig(base_url=server.base_url, max_concurrency=1), CollectorRegistry())
    final = sum(len(whole.completion_adapter(c)[0]) for c in convs)
    prompts = [b.completion_adapter(prefix_through_turn(c, k))[0] for c in convs for k in range(1, count_turns(c) + 1)]
    before = vllm_counters(server)
    t0 = time.perf_counter()
    for p in prompts:  # conversation order, turn by turn, as the stream delivers them
        await client.generate(server.adapter_model, [p], max_tokens=1, top_logprobs=20)
    seconds = time.perf_counter() - t0
    d = delta(vllm_counters(server), before)
    await client.stop()
    computed = d["vllm:prompt_tokens_total"] - d["vllm:prefix_cache_hits_total"]
    return {
        "conversations": len(convs),
        "turns": len(prompts),
        "final_tokens": final,
        "prompt_tokens": d["vllm:prompt_tokens_total"],
        "computed": computed,
        "ratio": computed / max(1, final),
        "per_turn": computed / max(1, len(prompts)),
        "mean_window": sum(map(len, prompts)) / max(1, len(prompts)),
        "seconds": seconds,
    }


def accuracy(
    tok: SafeTokenizer, cap: int | None, all_modes: list[tuple[str, int, int | None]], per_set: int, adapter: Path
) -> dict[str, Any]:
    model = load_model(ARTIFACTS / "base", adapter)
    end_id = tok.token_id(END_TAG)
    pad_id = tok.token_id("<|pad|>")
    out: dict[str, Any] = {}
    for d in sorted(p for p in DATA.iterdir() if (p / "test.jsonl").is_file()):
        exs = [json.loads(line) for line in (d / "test.jsonl").read_text().splitlines() if line.strip()][:per_set]
        msgs = [messages_from_json(e["messages"]) for e in exs]
        labels = [bool(e["complete"]) for e in exs]
        for name, window, stride in all_modes:
            b = builder(tok, window, stride, cap)
            prompts = [b.completion_adapter(m)[0] for m in msgs]
            p_end, greedy = next_token_probs(model, prompts, end_id, pad_id, desc=f"{d.name} {name}")
            m = binary_metrics(labels, [g == end_id for g in greedy], p_end)
            out.setdefault(d.name, {})[name] = {
                "n": len(exs),
                "f1": m["complete"]["f1"],
                "auc": m["roc_auc"],
                "mean_window": sum(map(len, prompts)) / max(1, len(prompts)),
            }
    return out


def prefill_all(
    args: argparse.Namespace,
    tok: SafeTokenizer,
    cap: int | None,
    whole: PromptBuilder,
    all_modes: list[tuple[str, int, int | None]],
) -> dict[str, Any]:
    pool = [c for c in load_conversations(2000, 10**6) if len(whole.completion_adapter(c)[0]) > 2 * args.window]
    need = args.conversations * len(all_modes)
    if len(pool) < need:
        raise SystemExit(f"only {len(pool)} conversations longer than twice the window; need {need}")
    out: dict[str, Any] = {}
    model = TinyModel(ARTIFACTS / "base", ARTIFACTS / "completion", ARTIFACTS / "base" / "tokenizer.json")
    with running_server(model, REPO / "build" / "bench-window-vllm.log", prefix_caching=True) as server:
        for i, (name, window, stride) in enumerate(all_modes):
            chunk = pool[i * args.conversations : (i + 1) * args.conversations]
            out[name] = asyncio.run(prefill(server, builder(tok, window, stride, cap), whole, chunk))
            print(f"(1) {name:>10}: {json.dumps(out[name])}", flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--window", type=int, default=256)
    p.add_argument("--strides", default="64,128,192")
    p.add_argument("--short-tails", default="224,192", help="plain tail windows shorter than the adapter's")
    p.add_argument("--conversations", type=int, default=24, help="long conversations per mode")
    p.add_argument("--per-set", type=int, default=250, help="test examples per data set for accuracy")
    p.add_argument("--skip-accuracy", action="store_true")
    p.add_argument("--skip-prefill", action="store_true")
    p.add_argument(
        "--adapter",
        type=Path,
        default=ARTIFACTS / "completion",
        help="adapter for the accuracy part (e.g. one trained with --window-stride)",
    )
    args = p.parse_args(argv)
    strides = [int(s) for s in args.strides.split(",") if s]
    all_modes = modes(args.window, strides, [int(w) for w in args.short_tails.split(",") if w])
    cap = message_cap(ARTIFACTS / "completion")
    tok = SafeTokenizer.from_model_dir(ARTIFACTS / "base")
    whole = PromptBuilder(tok, end_tag=END_TAG, instruct_prompt="x", max_prompt_tokens=10**6, max_message_tokens=cap)
    results: dict[str, Any] = {"window": args.window, "message_cap": cap, "prefill": {}, "adapter": str(args.adapter)}
    if not args.skip_prefill:
        results["prefill"] = prefill_all(args, tok, cap, whole, all_modes)
    if not args.skip_accuracy:
        if not DATA.is_dir():
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "adapters.cli",
                    "prepare",
                    "--out",
                    str(DATA),
                    "--max-train",
                    "1000",
                    "--max-test",
                    "250",
                ],
                check=True,
                stdout=subprocess.DEVNULL,
            )
        results["accuracy"] = accuracy(tok, cap, all_modes, args.per_set, args.adapter)
    report(results, [n for n, _, _ in all_modes])
    return 0


def report(r: dict[str, Any], names: list[str]) -> None:
    print(f"\nwindow {r['window']} ids, message cap {r['message_cap']}, adapter {r.get('adapter')}")
    print("| mode | turns | mean window | prefill computed / whole final tokens | prefill per turn |")
    print("|---|---|---|---|---|")
    for name, x in r["prefill"].items():
        print(f"| {name} | {x['turns']} | {x['mean_window']:.0f} | {x['ratio']:.2f} | {x['per_turn']:.0f} |")
    if "accuracy" in r:
        print("\n| data set (n) | " + " | ".join(f"F1 / AUC {n}" for n in names) + " |")
        print("|---|" + "---|" * len(names))
        for ds, row in r["accuracy"].items():
            cells = " | ".join(f"{row[n]['f1']:.3f} / {row[n]['auc']:.3f}" for n in names)
            print(f"| {ds} ({row['tail']['n']}) | {cells} |")
    sys.stdout.flush()


if __name__ == "__main__":
    raise SystemExit(main())
