"""Mixed batches on the real vLLM CPU server: how often base-model answers change beside LoRA-adapter
requests, with and without the client's lanes, and how often the self-test sees it.

    .venv/bin/python -m tests.bench.bench_mixed_batches [--rounds 10] [--self-tests 12]

Starts the suite's tiny-model server (or attaches to one, as the suite does, through
``SIDECAR_TEST_VLLM_ROOT_URL`` and ``SIDECAR_TEST_VLLM_MODEL_ROOT``), then, for ``mixed_batches``
``shared`` and ``separated``: the base top-k answers of 24 prompts sent alone, then ``--rounds``
rounds of the same prompts interleaved with as many adapter requests (answers changed per round),
and 12 base response trees (alpha 0.1, 6 tokens deep) alone and then built while adapter requests
run (trees changed per round); finally ``--self-tests`` fresh ``auto`` clients and what each
self-test decided. Prints one JSON document.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from sidecar.scoring.client import VllmClient
from sidecar.scoring.config import VllmEndpointConfig
from tests.scoring.test_mixed_batches_vllm import (
    ADAPTER,
    BASE,
    PROMPTS,
    TREES,
    alone_answers,
    answers_beside_adapter,
    base_tree,
    same_answer,
    tree_shape,
    trees_beside_adapter,
)
from tests.support.vllm_server import ATTACH_ROOT_URL_ENV, build_model, running_server


async def measure(base_url: str, rounds: int, self_tests: int) -> dict[str, Any]:
    out: dict[str, Any] = {"prompts": len(PROMPTS), "trees": TREES}
    for mode in ("shared", "separated"):
        client = VllmClient(VllmEndpointConfig(base_url=base_url + "/v1", mixed_batches=mode), CollectorRegistry())
        try:
            alone = await alone_answers(client, BASE)
            answers, seconds = [], 0.0
            for _ in range(rounds):
                t0 = time.monotonic()
                got = await answers_beside_adapter(client, BASE, ADAPTER)
                seconds += time.monotonic() - t0
                answers.append(sum(not same_answer(a, g) for a, g in zip(alone, got, strict=True)))
            trees_alone = [tree_shape(await base_tree(client, BASE, p)) for p in PROMPTS[:TREES]]
            trees = []
            for _ in range(rounds):
                got_trees = await trees_beside_adapter(client)
                trees.append(sum(a != b for a, b in zip(trees_alone, got_trees, strict=True)))
            out[mode] = {
                "answers_changed_per_round": answers,
                "trees_changed_per_round": trees,
                "seconds_per_round": round(seconds / rounds, 3),
            }
        finally:
            await client.stop()
    decisions = []
    for _ in range(self_tests):
        client = VllmClient(VllmEndpointConfig(base_url=base_url + "/v1"), CollectorRegistry())
        try:
            t0 = time.monotonic()
            await client.generate(ADAPTER, [PROMPTS[0]], max_tokens=1, top_logprobs=1)
            report = client.mixed_batches_report
            assert report is not None
            decisions.append({"mode": client.mixed_batches_mode, "rounds": report.rounds, "changed": report.changed,
                              "seconds": round(time.monotonic() - t0, 2)})  # fmt: skip
        finally:
            await client.stop()
    out["self_tests"] = decisions
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--self-tests", type=int, default=12)
    args = p.parse_args(argv)
    attached = os.environ.get(ATTACH_ROOT_URL_ENV)
    if attached:
        result = asyncio.run(measure(attached.rstrip("/"), args.rounds, args.self_tests))
    else:
        with tempfile.TemporaryDirectory() as tmp:
            model = build_model(Path(tmp) / "model")
            with running_server(model, Path(tmp) / "vllm.log") as server:
                result = asyncio.run(measure(server.root_url, args.rounds, args.self_tests))
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
