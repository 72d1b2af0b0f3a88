"""The committed demo artifacts: small, self-describing, loadable, and the adapter does its job."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest
import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM

from adapters.data.conversations import Conversation, eval_examples, split_of
from adapters.data.sources import read_conversations
from adapters.data.tokenizer import END_TAG, SPECIAL_TOKENS, encode_messages, load_tokenizer, special_id
from adapters.serving.manifest import file_sha256, message_cap
from sidecar.transcript.model import Message

ARTIFACTS = Path(__file__).resolve().parents[2] / "adapters" / "artifacts"
BASE = ARTIFACTS / "base"
ADAPTERS = ("completion", "completion-no-end-tag")


SAMPLE = Path(__file__).resolve().parents[2] / "sidecar" / "tools" / "demo" / "data" / "sample.jsonl.gz"


def _held_out_multiwoz(n: int) -> list[Conversation]:
    """Test-side MultiWOZ conversations of the bundled demo sample (the repo alone: no corpora)."""
    out = []
    for conv in read_conversations(SAMPLE):
        if conv.dataset.startswith("multiwoz") and split_of(conv) == "test":
            out.append(conv)
            if len(out) == n:
                break
    return out


def test_total_size_is_within_budget() -> None:
    total = sum(p.stat().st_size for p in ARTIFACTS.rglob("*") if p.is_file())
    assert total <= 40 * 1024 * 1024


@pytest.mark.parametrize("name", ADAPTERS)
def test_adapter_manifest_matches_files(name: str) -> None:
    d = ARTIFACTS / name
    manifest = json.loads((d / "manifest.json").read_text())
    assert manifest["adapter_sha256"] == file_sha256(d / "adapter_model.safetensors")
    cfg = json.loads((d / "adapter_config.json").read_text())
    assert cfg["base_model_name_or_path"] == "base"
    assert cfg["r"] <= 8
    base_manifest = json.loads((BASE / "manifest.json").read_text())
    assert manifest["training"]["base_model"]["weights_sha256"] is not None
    assert base_manifest["special_token_ids"][END_TAG] == special_id(load_tokenizer(BASE), END_TAG)


def test_tokenizer_specials_are_single_tokens() -> None:
    tok = load_tokenizer(BASE)
    config = json.loads((BASE / "config.json").read_text())
    assert tok.get_vocab_size() <= config["vocab_size"]
    for t in SPECIAL_TOKENS:
        assert tok.encode(t, add_special_tokens=False).ids == [special_id(tok, t)]


@torch.no_grad()
@pytest.mark.filterwarnings("ignore:.*is_gradient_checkpointing.*:FutureWarning")
def test_adapter_puts_the_end_tag_after_finished_conversations() -> None:
    """On held-out MultiWOZ conversations: P(end) is high after the full ones, low after truncated copies."""
    tok = load_tokenizer(BASE)
    end_id = special_id(tok, END_TAG)
    base = AutoModelForCausalLM.from_pretrained(str(BASE), dtype=torch.float32)
    model = PeftModel.from_pretrained(base, str(ARTIFACTS / "completion"))
    model.eval()

    def p_end(messages: Sequence[Message], adapter: bool = True) -> float:
        ids = torch.tensor([encode_messages(tok, messages, message_cap(ARTIFACTS / "completion"))[-256:]])
        if adapter:
            logits = model(input_ids=ids).logits
        else:
            with model.disable_adapter():
                logits = model(input_ids=ids).logits
        return float(torch.softmax(logits[0, -1], dim=-1)[end_id])

    full, cut, base_full = [], [], []
    convs = _held_out_multiwoz(12)
    assert len(convs) == 12
    for conv in convs:
        examples = eval_examples(conv, seed=0)
        full.append(p_end(examples[0].messages))
        base_full.append(p_end(examples[0].messages, adapter=False))
        cut.append(p_end(examples[1].messages))
    assert max(base_full) < 0.01  # the base model never learned the tag
    assert sum(full) / len(full) > 0.4
    assert sum(full) / len(full) > 2 * sum(cut) / len(cut)
