"""A freshly trained and exported adapter loads into the suite's real vLLM server and changes it.

Uses the shared session server (``tests.support.vllm_server``): its tiny base model, runtime LoRA
loading, and the sidecar's own scoring path, which ``adapters eval`` uses.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM

from adapters.data.tokenizer import END_TAG, encode_messages, encode_plain, load_tokenizer, special_id
from adapters.evaluation.evaluate import PromptMismatchError, SidecarScoring, check_prompts, sidecar_config
from adapters.serving.export import export_adapter
from adapters.training.lora import LoraRecipe, train_lora
from sidecar.transcript.model import Message
from tests.adapters.conftest import to_messages


@pytest.fixture(scope="module")
def exported_toy_adapter(
    vllm_server: Any, tmp_path_factory: pytest.TempPathFactory, toy_records: list[dict[str, Any]]
) -> Path:
    root = tmp_path_factory.mktemp("toy-adapter")
    data = root / "prepared"
    (data / "toy").mkdir(parents=True)
    with (data / "toy" / "train.jsonl").open("w") as fh:
        for r in toy_records[:8]:
            fh.write(
                json.dumps(
                    {
                        "conversation_id": r["conversation_id"],
                        "messages": r["turns"],
                        "target_start": len(r["turns"]) - 1,
                    }
                )
                + "\n"
            )
    (data / "manifest.json").write_text("{}\n")
    recipe = LoraRecipe(
        rank=8,
        alpha=16,
        dropout=0.0,
        epochs=3,
        learning_rate=2e-2,
        batch_size=8,
        max_context_tokens=256,
        target_modules=("q_proj", "v_proj"),
    )
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


async def test_exported_adapter_loads_and_serves_what_it_learned(
    vllm_server: Any, exported_toy_adapter: Path, toy_records: list[dict[str, Any]]
) -> None:
    """Through the sidecar's scoring path, vLLM serves the adapter as peft computes it; it differs from the base."""
    tok = load_tokenizer(vllm_server.model_dir)
    end_id = special_id(tok, END_TAG)
    conversations = [to_messages(r) for r in toy_records[:4]]
    async with httpx.AsyncClient(base_url=vllm_server.root_url, timeout=60.0) as client:
        names = {m["id"] for m in (await client.get("/v1/models")).json()["data"]}
        assert "adapters-toy" in names
    turn_id = encode_plain(tok, "TURN 1, STEP 1, user chat:\n")[0]
    scoring = SidecarScoring(sidecar_config(f"{vllm_server.root_url}/v1", vllm_server.model_dir, 256), turn_id)
    await scoring.scorers.start()
    try:
        served = await scoring.score_all(conversations, "adapters-toy", turn_rule=True, desc="adapter")
        base = await scoring.score_all(conversations, "base", turn_rule=False, desc="base")
    finally:
        await scoring.scorers.stop()
    prompts = [encode_messages(tok, m)[-256:] for m in conversations]
    expected = _hf_end_logprobs(vllm_server.model_dir, exported_toy_adapter, prompts, end_id)
    assert [float(np.log(v.p_end)) for v in served] == pytest.approx(expected, abs=2e-2)
    assert max(abs(np.log(a.p_end) - np.log(b.p_end)) for a, b in zip(served, base, strict=True)) > 0.1
    assert all(v.p_turn is not None and 0.0 <= v.p_turn <= 1.0 for v in served)
    assert all(v.p_end_method in {"top_k", "token_ids", "forced", "prompt_logprobs"} for v in served)


def test_eval_prompts_are_the_training_windows(vllm_server: Any) -> None:
    """``adapters eval`` refuses to score when the sidecar would send another window than training used."""
    tok = load_tokenizer(vllm_server.model_dir)
    long = [m for i in range(30) for m in (Message("user", f"book table {i} for two"), Message("assistant", "sure"))]
    assert len(encode_messages(tok, long)) > 64
    config = sidecar_config("http://127.0.0.1:9/v1", vllm_server.model_dir, 64)
    check_prompts(SidecarScoring(config, 0), tok, [long, long[:3]], 64)
    turns = config.model_copy(update={"prompt_truncation": "turns"})
    with pytest.raises(PromptMismatchError, match="example 0"):
        check_prompts(SidecarScoring(turns, 0), tok, [long], 64)
