"""``adapters train-base``: a small Llama and a byte-level BPE trained from scratch on dialogues.

No pretrained weights can be downloaded in development and CI, so the "base chat model" of the
paper is stood in for by a tiny Llama pretrained on the rendered train-side conversations of the
shared datasets. It never sees the end tag: conversations are chunked into windows with no
end-of-document marker, so the base model has no notion of "the conversation is over" (that is
what the adapter adds). Weights are stored in bfloat16 (vLLM loads them with ``--dtype float32``).
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import structlog
import torch
from tqdm import tqdm
from transformers import LlamaConfig, LlamaForCausalLM

from adapters.data.conversations import messages_from_json
from adapters.data.tokenizer import (
    BOS,
    END_TAG,
    EOS,
    PAD,
    encode_messages,
    save_tokenizer,
    special_id,
    train_tokenizer,
)
from adapters.serving.manifest import file_sha256, write_manifest
from adapters.training.loop import LoopConfig, TrainSeq, train_loop
from sidecar.transcript.render import render_text

log = structlog.get_logger()


@dataclass(frozen=True, slots=True)
class BaseModelSpec:
    vocab_size: int = 4096
    hidden_size: int = 256
    num_layers: int = 4
    num_heads: int = 4
    intermediate_size: int = 688
    max_position_embeddings: int = 1024
    window_tokens: int = 512


def iter_train_conversations(data_dir: Path, datasets: list[str]) -> Iterator[tuple[str, list[Any]]]:
    for name in datasets:
        with (data_dir / name / "train.jsonl").open() as fh:
            for line in fh:
                rec = json.loads(line)
                yield name, rec["messages"]


def windows(ids: list[int], width: int) -> list[list[int]]:
    """Consecutive windows of ``width`` ids; the last one is aligned to the end (overlapping)."""
    if len(ids) <= width:
        return [ids]
    out = [ids[i : i + width] for i in range(0, len(ids) - width + 1, width)]
    if (len(ids) - width) % width:
        out.append(ids[-width:])
    return out


def build_model(spec: BaseModelSpec, tok_ids: dict[str, int]) -> Any:
    config = LlamaConfig(
        vocab_size=spec.vocab_size,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_heads,
        max_position_embeddings=spec.max_position_embeddings,
        tie_word_embeddings=True,
        bos_token_id=tok_ids[BOS],
        eos_token_id=tok_ids[EOS],
        pad_token_id=tok_ids[PAD],
    )
    return LlamaForCausalLM(config)


@torch.no_grad()
def rescale_unseen_rows(model: Any, token_ids: list[int]) -> float:
    """Give never-trained special-token rows the median norm of the trained embedding rows.

    The base model never sees the end tag, so its (tied) embedding row keeps its tiny initial
    norm, and no hidden state could then give it a large logit: the adapter, which cannot change
    the embedding (vLLM serves no ``modules_to_save``), could not make it the argmax. A random
    direction at the typical norm leaves the base model's own predictions unchanged in practice
    (the row stays unrelated to anything it learned) while making the tag reachable.
    """
    emb = model.get_input_embeddings().weight
    seen = torch.ones(emb.shape[0], dtype=torch.bool)
    seen[token_ids] = False
    target = float(emb[seen].norm(dim=1).median())
    gen = torch.Generator().manual_seed(1234)
    for tid in token_ids:
        row = torch.randn(emb.shape[1], generator=gen)
        emb[tid] = row / row.norm() * target
    return round(target, 4)


def train_base(
    data_dir: Path,
    datasets: list[str],
    out_dir: Path,
    spec: BaseModelSpec,
    *,
    epochs: float,
    batch_size: int,
    learning_rate: float,
    max_tokens: int | None,
    seed: int,
    max_steps: int | None = None,
) -> dict[str, Any]:
    """Train tokenizer + model, save both into ``out_dir`` with a manifest."""
    out_dir.mkdir(parents=True, exist_ok=True)
    convs = [(n, messages_from_json(m)) for n, m in iter_train_conversations(data_dir, datasets)]
    random.Random(seed).shuffle(convs)
    tok = train_tokenizer((render_text(m) for _, m in convs), spec.vocab_size)
    save_tokenizer(tok, out_dir, spec.max_position_embeddings)
    ids_map = {t: special_id(tok, t) for t in (BOS, EOS, PAD, END_TAG)}
    seqs: list[TrainSeq] = []
    n_tokens = 0
    per_dataset: dict[str, int] = {}
    for name, msgs in tqdm(convs, desc="tokenize", unit="conv", leave=False):
        for w in windows(encode_messages(tok, msgs), spec.window_tokens):
            seqs.append(TrainSeq(w, list(w)))
            n_tokens += len(w)
            per_dataset[name] = per_dataset.get(name, 0) + len(w)
        if max_tokens is not None and n_tokens >= max_tokens:
            break
    log.info("adapters.base.corpus", sequences=len(seqs), tokens=n_tokens)
    torch.manual_seed(seed)
    model = build_model(spec, ids_map)
    cfg = LoopConfig(
        epochs=epochs,
        batch_size=batch_size,
        learning_rate=learning_rate,
        weight_decay=0.1,
        warmup_fraction=0.05,
        seed=seed,
        checkpoint_every_steps=50,
        max_steps=max_steps,
    )
    result = train_loop(
        model,
        seqs,
        cfg,
        ids_map[PAD],
        out_dir / "checkpoint.pt",
        make_optimizer=lambda ps: torch.optim.AdamW(
            ps, lr=learning_rate, weight_decay=cfg.weight_decay, betas=(0.9, 0.95)
        ),
    )
    rescaled = rescale_unseen_rows(model, [ids_map[END_TAG], ids_map[BOS], ids_map[EOS]])
    model.to(torch.bfloat16).save_pretrained(out_dir, safe_serialization=True)
    (out_dir / "checkpoint.pt").unlink(missing_ok=True)
    hist = result["loss_history"]
    write_manifest(
        out_dir,
        "base-model",
        architecture="LlamaForCausalLM",
        spec=asdict(spec),
        storage_dtype="bfloat16",
        special_token_ids=ids_map,
        unseen_rows_rescaled_to_norm=rescaled,
        data={
            "prepared_manifest_sha256": file_sha256(data_dir / "manifest.json"),
            "datasets": datasets,
            "tokens": n_tokens,
            "tokens_per_dataset": per_dataset,
            "sequences": len(seqs),
        },
        hyperparameters={
            "epochs": epochs,
            "batch_size": batch_size,
            "learning_rate": learning_rate,
            "weight_decay": 0.1,
            "optimizer": "torch AdamW",
            "seed": seed,
        },
        metrics={
            "steps": result["steps"],
            "train_seconds": result["train_seconds"],
            "loss_first_20": _mean(hist[:20]),
            "loss_last_20": _mean(hist[-20:]),
        },
    )
    return {
        "tokens": n_tokens,
        **{k: v for k, v in result.items() if k != "loss_history"},
        "loss_first_20": _mean(hist[:20]),
        "loss_last_20": _mean(hist[-20:]),
    }


def _mean(xs: list[float]) -> float | None:
    return round(sum(xs) / len(xs), 4) if xs else None
