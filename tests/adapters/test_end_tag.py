"""``adapters add-end-tag``: a base without the end tag gets one (added or a reserved token reused), its
rows initialised, and vLLM serves the result with an adapter trained on it."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
import torch
from safetensors.torch import load_file
from tokenizers import Tokenizer
from transformers import LlamaConfig, LlamaForCausalLM

from adapters.cli import main
from adapters.data.tokenizer import END_TAG, encode_plain, train_tokenizer
from adapters.serving.export import export_adapter
from adapters.training.end_tag import add_end_tag
from adapters.training.lora import train_lora
from adapters.training.recipe import LoraRecipe
from sidecar.tools.local_vllm import LocalVllmServer, LocalVllmSpec
from tests.adapters.conftest import synthetic_conversation

pytestmark = pytest.mark.filterwarnings("ignore:.*is_gradient_checkpointing.*:FutureWarning")

BOS, EOS = "<|begin_of_text|>", "<|end_of_text|>"
RESERVED = ["<|reserved_special_token_0|>", "<|reserved_special_token_1|>"]
CORPUS = [
    "TURN 1, STEP 1, user chat:\nbook a table for two tonight please",
    "TURN 1, STEP 2, assistant chat:\nsure, done. you are welcome, goodbye.",
] * 10


def stock_base(root: Path, *, reserved: bool, tied: bool = False) -> Path:
    """A tiny Llama like a stock base: no end tag, no pad token (optionally reserved special tokens)."""
    root.mkdir(parents=True)
    tok = train_tokenizer(CORPUS, 300, special_tokens=[BOS, EOS, *(RESERVED if reserved else [])])
    tok.save(str(root / "tokenizer.json"))
    cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": BOS, "eos_token": EOS}
    (root / "tokenizer_config.json").write_text(json.dumps(cfg))
    torch.manual_seed(0)
    model = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=tok.get_vocab_size(),
            hidden_size=128,
            intermediate_size=256,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=2,
            max_position_embeddings=1024,
            tie_word_embeddings=tied,
            bos_token_id=0,
            eos_token_id=1,
        )
    )
    model.save_pretrained(str(root), safe_serialization=True)
    return root


@pytest.mark.parametrize("tied", [False, True])
def test_added_end_tag_is_one_special_token_with_a_typical_row(tmp_path: Path, tied: bool) -> None:
    base = stock_base(tmp_path / "base", reserved=False, tied=tied)
    rows = Tokenizer.from_file(str(base / "tokenizer.json")).get_vocab_size()
    result = add_end_tag(base, tmp_path / "out")
    assert (result["method"], result["end_tag_id"], result["rows_after"]) == ("add", rows, rows + 1)
    tok = Tokenizer.from_file(str(tmp_path / "out" / "tokenizer.json"))
    assert tok.encode(END_TAG, add_special_tokens=False).ids == [rows]
    assert rows not in encode_plain(tok, f"typed by a user: {END_TAG}")  # content never becomes the tag
    before, after = load_file(str(base / "model.safetensors")), load_file(str(tmp_path / "out" / "model.safetensors"))
    emb = after["model.embed_tokens.weight"]
    assert torch.equal(emb[:rows], before["model.embed_tokens.weight"])  # nothing else moved
    norms = emb[:rows].norm(dim=1)
    assert float(emb[rows].norm()) == pytest.approx(float(norms.median()), rel=1e-3)
    if not tied:
        head = after["lm_head.weight"]
        assert float(head[rows].norm()) == pytest.approx(float(head[:rows].norm(dim=1).median()), rel=1e-3)
    cfg = json.loads((tmp_path / "out" / "tokenizer_config.json").read_text())
    assert cfg["added_tokens_decoder"][str(rows)]["special"] is True and END_TAG in cfg["additional_special_tokens"]
    assert json.loads((tmp_path / "out" / "config.json").read_text())["vocab_size"] == rows + 1
    again = add_end_tag(tmp_path / "out", tmp_path / "again")
    assert (again["method"], again["end_tag_id"]) == ("present", rows)


def test_a_reserved_special_token_is_reused_without_a_resize(tmp_path: Path) -> None:
    base = stock_base(tmp_path / "base", reserved=True)
    reserved_id = Tokenizer.from_file(str(base / "tokenizer.json")).token_to_id(RESERVED[0])
    result = add_end_tag(base, tmp_path / "out")
    assert (result["method"], result["end_tag_id"], result["renamed_token"]) == ("reuse", reserved_id, RESERVED[0])
    assert result["rows_before"] == result["rows_after"]
    tok = Tokenizer.from_file(str(tmp_path / "out" / "tokenizer.json"))
    assert tok.token_to_id(RESERVED[0]) is None and tok.token_to_id(RESERVED[1]) is not None
    assert add_end_tag(base, tmp_path / "never", reuse_reserved=False)["method"] == "add"


def test_cli_refuses_what_is_not_a_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (
        ["--base", str(tmp_path), "--out", str(tmp_path / "o")],
        ["--base", str(stock_base(tmp_path / "b", reserved=False)), "--out", str(tmp_path / "b")],
    ):
        with pytest.raises(SystemExit) as exc:
            main(["add-end-tag", *argv])
        assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "not a model directory" in err and "--out must differ" in err


@pytest.mark.slow
def test_vllm_serves_the_converted_base_with_an_adapter_trained_on_it(tmp_path: Path) -> None:
    base = tmp_path / "with-tag"
    end_id = add_end_tag(stock_base(tmp_path / "base", reserved=False), base)["end_tag_id"]
    data = tmp_path / "prepared"
    (data / "toy").mkdir(parents=True)
    with (data / "toy" / "train.jsonl").open("w") as fh:
        for i in range(16):
            rec = synthetic_conversation(i, 2)
            fh.write(
                json.dumps(
                    {
                        "conversation_id": rec["conversation_id"],
                        "messages": rec["turns"],
                        "target_start": len(rec["turns"]) - 1,
                    }
                )
                + "\n"
            )
    (data / "manifest.json").write_text("{}\n")
    recipe = LoraRecipe(epochs=2, learning_rate=3e-3, max_context_tokens=256, decision_windows=1)
    train_lora(data, ["toy"], base, tmp_path / "trained", recipe)  # no <|pad|>: pads with eos
    export_adapter(tmp_path / "trained", tmp_path / "adapter", "base")
    server = LocalVllmServer(
        LocalVllmSpec(model_dir=base, lora_modules={"completion": tmp_path / "adapter"}, max_model_len=1024),
        tmp_path / "vllm.log",
    )
    server.start()
    try:
        server.wait_ready_blocking()
        with httpx.Client(timeout=300) as http:
            ids = http.post(server.root_url + "/tokenize", json={"model": "base", "prompt": END_TAG}).json()["tokens"]
            assert end_id in ids
            resp = http.post(
                server.base_url + "/completions",
                json={
                    "model": "completion",
                    "prompt": [5, 6, 7],
                    "max_tokens": 1,
                    "logprobs": 1,
                    "allowed_token_ids": [end_id],
                    "return_tokens_as_token_ids": True,
                },
            ).json()
        assert resp["choices"][0]["logprobs"]["tokens"] == [f"token_id:{end_id}"], resp
    finally:
        server.stop()
