"""A freshly trained and exported adapter loads into the suite's real vLLM server and changes it.

Uses the shared session server (``tests.support.vllm_server``): its tiny base model, runtime LoRA
loading, and the exact P(end) reading the evaluation uses.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM

from adapters.export import export_adapter
from adapters.lora import LoraRecipe, train_lora
from adapters.tokenizer import END_TAG, encode_messages, load_tokenizer, special_id
from adapters.vllm_server import exact_logprob, next_token
from tests.adapters.conftest import to_messages


@pytest.fixture(scope="module")
def exported_toy_adapter(vllm_server: Any, tmp_path_factory: pytest.TempPathFactory,
                         toy_records: list[dict[str, Any]]) -> Path:
    root = tmp_path_factory.mktemp("toy-adapter")
    data = root / "prepared"
    (data / "toy").mkdir(parents=True)
    with (data / "toy" / "train.jsonl").open("w") as fh:
        for r in toy_records[:8]:
            fh.write(json.dumps({"conversation_id": r["conversation_id"], "messages": r["turns"],
                                 "target_start": len(r["turns"]) - 1}) + "\n")
    (data / "manifest.json").write_text("{}\n")
    recipe = LoraRecipe(rank=8, alpha=16, dropout=0.0, epochs=3, learning_rate=2e-2, batch_size=8,
                        max_context_tokens=256, target_modules=("q_proj", "v_proj"))
    train_lora(data, ["toy"], vllm_server.model_dir, root / "trained", recipe)
    export_adapter(root / "trained", root / "exported", "base", max_lora_rank=8)
    vllm_server.load_adapter("adapters-toy", root / "exported")
    return root / "exported"


# peft reads transformers' deprecated ``is_gradient_checkpointing`` alias when loading an adapter.
pytestmark = pytest.mark.filterwarnings("ignore:.*is_gradient_checkpointing.*:FutureWarning")


@torch.no_grad()
def _hf_end_logprobs(model_dir: Path, adapter_dir: Path, prompts: list[list[int]], end_id: int) -> list[float]:
    base = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    model = PeftModel.from_pretrained(base, str(adapter_dir))
    model.eval()
    out = []
    for ids in prompts:
        logits = model(input_ids=torch.tensor([ids])).logits[0, -1]
        out.append(float(torch.log_softmax(logits, dim=-1)[end_id]))
    return out


def test_exported_adapter_loads_and_serves_what_it_learned(vllm_server: Any, exported_toy_adapter: Path,
                                                           toy_records: list[dict[str, Any]]) -> None:
    """vLLM serves the exported adapter exactly as peft computes it, and it differs from the base."""
    tok = load_tokenizer(vllm_server.model_dir)
    end_id = special_id(tok, END_TAG)
    prompts = [encode_messages(tok, to_messages(r)) for r in toy_records[:4]]
    with httpx.Client(base_url=vllm_server.root_url, timeout=60.0) as client:
        names = {m["id"] for m in client.get("/v1/models").json()["data"]}
        assert "adapters-toy" in names
        served, base = [], []
        for ids in prompts:  # one at a time: exact lookups must not share a batch (see next_token)
            served.append(math.log(next_token(client, "adapters-toy", ids, [end_id]).probs[end_id]))
            base.append(math.log(next_token(client, "base", ids, [end_id]).probs[end_id]))
    expected = _hf_end_logprobs(vllm_server.model_dir, exported_toy_adapter, prompts, end_id)
    assert served == pytest.approx(expected, abs=2e-2)
    assert max(abs(a - b) for a, b in zip(served, base, strict=True)) > 0.1


def test_exact_lookup_agrees_with_top_logprobs(vllm_server: Any, toy_records: list[dict[str, Any]]) -> None:
    tok = load_tokenizer(vllm_server.model_dir)
    ids = encode_messages(tok, to_messages(toy_records[0]))
    with httpx.Client(base_url=vllm_server.root_url, timeout=60.0) as client:
        body = {"model": "base", "prompt": ids, "max_tokens": 1, "temperature": 0.0, "logprobs": 5,
                "return_tokens_as_token_ids": True}
        top = client.post("/v1/completions", json=body).json()["choices"][0]["logprobs"]["top_logprobs"][0]
        for key, lp in list(top.items())[:3]:
            tid = int(key.split(":", 1)[1])
            assert exact_logprob(client, "base", ids, tid) == pytest.approx(lp, abs=1e-4)
