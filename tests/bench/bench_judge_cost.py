"""Cost per conversation: the sidecar's scoring against the built-in two-dimensional LLM judge.

Same base model (the bundled one in ``adapters/artifacts``, or ``--model-dir``/``--adapter-dir``),
same vLLM CPU server (base + completion LoRA, prefix caching on, a plain chat template for the
judge), same conversations: the first ``--limit`` examples of the SGD dev truncation protocol
(each conversation complete, labelled complete, and a copy cut at a seeded turn, labelled not
complete), the labels ``sidecar judge --protocol truncation`` scores against.

Methods, each run at concurrency 1 and 16 (conversations in flight; a conversation's turns are
scored one after another, as the stream delivers them):

- sidecar, completion: the completion score after every turn (the adapter); the verdict is the
  last turn's ``complete``;
- sidecar, completion + tree: the same plus a response tree (the base model, ``scoring.tree``
  defaults) at every user message: every turn fully scored;
- judge: ``TwoDimensionalJudge`` once per conversation (two chat requests, vLLM structured
  outputs); undecided counts as not complete (the judge's safe default).

Requests, prefill tokens actually computed (prompt tokens minus prefix-cache hits) and generated
tokens come from vLLM's own counters; wall time per conversation is the run's elapsed time over
its conversations. Server start, warm-up and the client's self-tests run before any of it. The
passes run in the order printed on one server, so the first pass of each method finds its prompts
cold in the prefix cache and the tree pass finds the completion prompts of the passes before it
warm; the token columns are those of each method's concurrency-1 pass.

    SIDECAR_SHARED_DIR=../shared nice -n 10 .venv/bin/python -m tests.bench.bench_judge_cost \\
        [--limit 16] [--judge-max-tokens 96] [--judge-max-transcript-chars 700]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from sidecar.judge.config import JudgeConfig
from sidecar.judge.judge import TwoDimensionalJudge
from sidecar.judge.metrics import JudgeMetrics
from sidecar.scoring.client import VllmClient
from sidecar.scoring.completion import CompletionScorer
from sidecar.scoring.config import TreeConfig
from sidecar.scoring.prompts import PromptBuilder
from sidecar.scoring.tree import TreeBudget, TreeExpander
from sidecar.tools.classification import confusion, precision_recall_f1
from sidecar.tools.judge.dataset import JudgeExample, ReadStats, read_examples
from sidecar.transcript.model import Message, count_turns, prefix_through_turn
from sidecar.transcript.tokenize import SafeTokenizer
from tests.bench.bench_scoring import Modes, delta, prompt_budget, resolve_model, resolve_modes, vllm_counters
from tests.support.corpora import corpora_dir
from tests.support.tiny_model import END_TAG
from tests.support.vllm_server import VllmServer, running_server

# The bundled base ships no chat template: the judge's one user message, as plain text.
PLAIN_TURNS = (
    "{{ bos_token }}{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)
CONCURRENCY = (1, 16)

Verdicts = Callable[[VllmServer, SafeTokenizer, Sequence[JudgeExample], int], Awaitable[tuple[list[bool], str]]]


def until_user(msgs: Sequence[Message]) -> list[Message]:
    out = list(msgs)
    while out and out[-1].role != "user":
        out.pop()
    return out


def sidecar_method(modes: Modes, *, trees: bool) -> Verdicts:
    async def run(
        server: VllmServer, tok: SafeTokenizer, examples: Sequence[JudgeExample], concurrency: int
    ) -> tuple[list[bool], str]:
        tc = TreeConfig()
        stops = sorted(tok.special_ids - {tok.bos_id, tok.token_id("<|pad|>")} - {None})
        scoring = PromptBuilder(tok, end_tag=END_TAG, instruct_prompt="x", max_prompt_tokens=prompt_budget(server, 16))
        tree_prompts = PromptBuilder(
            tok, end_tag=END_TAG, instruct_prompt="x", max_prompt_tokens=prompt_budget(server, tc.max_depth_tokens)
        )
        client = VllmClient(modes.endpoint(server, concurrency), CollectorRegistry())
        scorer = CompletionScorer(
            client, end_ids=[tok.token_id(END_TAG)], stop_token_ids=stops, max_remaining_tokens=16, decode=tok.decode
        )
        expander = TreeExpander(
            client,
            alpha=tc.alpha,
            budget=TreeBudget(tc.max_depth_tokens, tc.max_generated_tokens, tc.max_requests, tc.max_leaves),
            stop_token_ids=stops,
        )
        sem = asyncio.Semaphore(concurrency)

        async def one(ex: JudgeExample) -> bool:
            async with sem:
                complete = False
                for k in range(1, count_turns(ex.messages) + 1):
                    prefix = prefix_through_turn(ex.messages, k)
                    if trees and (asked := until_user(prefix)):
                        await expander.expand(server.base_model, tree_prompts.tree(asked)[0])
                    score = await scorer.score(server.adapter_model, scoring.completion_adapter(prefix)[0])
                    complete = score.complete
                return complete

        try:
            return list(await asyncio.gather(*(one(ex) for ex in examples))), ""
        finally:
            await client.stop()

    return run


def judge_method(args: argparse.Namespace) -> Verdicts:
    async def run(
        server: VllmServer, tok: SafeTokenizer, examples: Sequence[JudgeExample], concurrency: int
    ) -> tuple[list[bool], str]:
        cfg = JudgeConfig.model_validate(
            {
                "max_transcript_chars": args.judge_max_transcript_chars,
                "llm": {
                    "base_url": server.base_url,
                    "model": server.base_model,
                    "max_tokens": args.judge_max_tokens,
                    "structured_output": "vllm_structured_outputs",
                    "max_concurrency": 2 * concurrency,
                    "request_timeout_seconds": 1800,
                    "max_attempts": 1,
                },
            }
        )
        judge = TwoDimensionalJudge(cfg, JudgeMetrics(CollectorRegistry()))
        sem = asyncio.Semaphore(concurrency)
        labels: dict[str, int] = {}

        async def one(ex: JudgeExample) -> bool:
            async with sem:
                verdict = await judge.judge(ex.messages)
                labels[verdict.label] = labels.get(verdict.label, 0) + 1
                for d in (verdict.accuracy, verdict.completeness):
                    if d.error is not None:
                        labels[f"error {d.error}"] = labels.get(f"error {d.error}", 0) + 1
                return verdict.complete

        try:
            out = list(await asyncio.gather(*(one(ex) for ex in examples)))
        finally:
            await judge.aclose()
        return out, ", ".join(f"{v} {k}" for k, v in sorted(labels.items()))

    return run


async def measure(
    server: VllmServer, tok: SafeTokenizer, examples: Sequence[JudgeExample], method: Verdicts, concurrency: int
) -> dict[str, Any]:
    before = vllm_counters(server)
    t0 = time.perf_counter()
    predictions, note = await method(server, tok, examples, concurrency)
    seconds = time.perf_counter() - t0
    d = delta(vllm_counters(server), before)
    labels = [bool(ex.label) for ex in examples]
    c = confusion(labels, predictions)
    _, _, f1 = precision_recall_f1(c.tp, c.fp, c.fn)
    n = len(examples)
    return {
        "seconds_per_conversation": seconds / n,
        "requests": d["vllm:request_success_total"] / n,
        "prefill": (d["vllm:prompt_tokens_total"] - d["vllm:prefix_cache_hits_total"]) / n,
        "prompt": d["vllm:prompt_tokens_total"] / n,
        "generated": d["vllm:generation_tokens_total"] / n,
        "f1": f1,
        "predicted_complete": sum(predictions),
        "note": note,
    }


async def run_all(
    server: VllmServer, tok: SafeTokenizer, examples: Sequence[JudgeExample], args: argparse.Namespace
) -> dict[str, Any]:
    t0 = time.perf_counter()
    modes, one_time = await resolve_modes(server, tok, "auto", "auto")
    one_time["seconds"] = time.perf_counter() - t0
    methods: dict[str, Verdicts] = {
        "sidecar, completion score after every turn": sidecar_method(modes, trees=False),
        "sidecar, completion + response tree at every turn": sidecar_method(modes, trees=True),
        "two-dimensional judge, once per conversation": judge_method(args),
    }
    out: dict[str, Any] = {"modes": modes.describe(), "one_time": one_time, "rows": {}}
    for name, method in methods.items():
        for c in CONCURRENCY:
            # Each pass re-reads the same conversations: the prefix cache may hold them from the
            # pass before, which favours every method alike; the first pass of each is cold for it.
            out["rows"][(name, c)] = await measure(server, tok, examples, method, c)
            r = out["rows"][(name, c)]
            print(f"  {name}, concurrency {c}: {r['seconds_per_conversation']:.2f} s/conversation", flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", default="sgd")
    p.add_argument("--limit", type=int, default=16, help="examples (full conversations and their cut copies)")
    p.add_argument("--judge-max-tokens", type=int, default=96)
    p.add_argument(
        "--judge-max-transcript-chars",
        type=int,
        default=700,
        help="the judge's transcript budget; the bundled base's 1,024-token context holds ~580 prompt tokens "
        "of instructions, so a longer transcript is refused as prompt_too_long",
    )
    p.add_argument("--model-dir")
    p.add_argument("--adapter-dir")
    args = p.parse_args(argv)
    data = corpora_dir() / args.dataset / "dev.jsonl.gz"
    if not data.exists():
        print(f"no {data}: this benchmark needs the shared datasets", file=sys.stderr)
        return 2
    examples: list[JudgeExample] = []
    for ex in read_examples(data, stats=ReadStats(), protocol="truncation"):
        examples.append(ex)
        if len(examples) == args.limit:
            break
    with tempfile.TemporaryDirectory(prefix="bench-judge-cost-") as tmp:
        root = Path(tmp)
        model, origin = resolve_model(args, root / "model")
        tok = SafeTokenizer.from_model_dir(model.model_dir)
        template = root / "plain-turns.jinja"
        template.write_text(PLAIN_TURNS, encoding="utf-8")
        print(f"model: {origin}: {model.model_dir.name} + {model.adapter_dir.name}", flush=True)
        t0 = time.perf_counter()
        with running_server(model, root / "vllm.log", extra_args=("--chat-template", str(template))) as server:
            started = time.perf_counter() - t0
            result = asyncio.run(run_all(server, tok, examples, args))
    report(result, examples, args, started)
    return 0


def report(result: dict[str, Any], examples: Sequence[JudgeExample], args: argparse.Namespace, started: float) -> None:
    positives = sum(1 for ex in examples if ex.label)
    turns = sum(count_turns(ex.messages) for ex in examples) / len(examples)
    o = result["one_time"]
    print(
        f"\n{len(examples)} SGD dev examples ({positives} complete, {len(examples) - positives} cut), "
        f"{turns:.1f} turns per conversation; one-time: server start {started:.1f}s, warm-up and self-tests "
        f"{o['seconds']:.1f}s; sidecar modes: {result['modes']}; judge: max_tokens {args.judge_max_tokens}, "
        f"max_transcript_chars {args.judge_max_transcript_chars}, vLLM structured outputs"
    )
    print(
        "| method | requests / conv. | prefill tokens / conv. (prompt) | generated / conv. | "
        "s / conv. at 1 | s / conv. at 16 | F1 | predicted complete |"
    )
    print("|---|---|---|---|---|---|---|---|")
    names = dict.fromkeys(name for name, _ in result["rows"])
    for name in names:
        r1, r16 = result["rows"][(name, 1)], result["rows"][(name, 16)]
        # No conversation predicted complete leaves precision undefined; F1 is then 0 (no true positive).
        f1 = "0 (none predicted complete)" if r1["f1"] is None and positives else f"{r1['f1'] or 0:.3f}"
        print(
            f"| {name} | {r1['requests']:.1f} | {r1['prefill']:,.0f} ({r1['prompt']:,.0f}) | {r1['generated']:,.0f} | "
            f"{r1['seconds_per_conversation']:.2f} | {r16['seconds_per_conversation']:.2f} | {f1} | "
            f"{r1['predicted_complete']} of {len(examples)} |"
        )
    for name in names:
        for c in CONCURRENCY:
            r = result["rows"][(name, c)]
            if r["note"]:
                print(f"  {name}, concurrency {c}: {r['note']}")
    sidecar = result["rows"][(next(iter(names)), 16)]
    judge = result["rows"][(list(names)[-1], 16)]
    print(
        f"per 1,000 conversations at concurrency 16: judge {judge['seconds_per_conversation'] * 1000 / 60:.1f} min, "
        f"sidecar completion {sidecar['seconds_per_conversation'] * 1000 / 60:.1f} min; "
        f"ratio judge / sidecar {judge['seconds_per_conversation'] / sidecar['seconds_per_conversation']:.2f}"
    )
    sys.stdout.flush()


if __name__ == "__main__":
    raise SystemExit(main())
