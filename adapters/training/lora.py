"""``adapters train-lora``: peft LoRA SFT with the paper's recipe (Section 5.1).

Recipe: 3 epochs, learning rate 2e-4, weight decay 0.01, AdamW (8-bit from bitsandbytes when it
and CUDA are present, torch AdamW otherwise), loss on the target only (r_n + the end tag).

Sequence = ids(render(p_1, r_1, ..., p_n, r_n)) + [end tag], left-truncated to the last
``max_context_tokens`` ids; labels are IGNORE before the first id of r_n's block. The ablation
``--no-end-tag`` trains the same thing without the final end-tag id.

On a GPU with a real base model (e.g. an 8B Llama) the same command works unchanged: the model
is loaded in bfloat16, gradient checkpointing is enabled and training runs under bf16 autocast;
the CUDA allocator uses expandable segments unless configured otherwise, and ``micro_batch_size``
splits each batch into slices whose gradients are accumulated (the same update, less memory).
"""

from __future__ import annotations

import importlib.util
import json
import math
import random
import re
import warnings
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import structlog
import torch
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import AutoModelForCausalLM

from adapters.data.conversations import messages_from_json
from adapters.data.tokenizer import END_TAG, encode_messages_with_offsets, load_tokenizer, padding_id, special_id
from adapters.errors import DataError
from adapters.serving.manifest import file_sha256, read_manifest, write_manifest
from adapters.training.loop import IGNORE, LoopConfig, TrainSeq, train_loop
from adapters.training.recipe import LOSS_MODES, LoraRecipe, check_micro_batch
from adapters.training.resources import configure_cuda_allocator, peak_memory, reset_peak_memory
from sidecar.transcript.model import Message
from sidecar.transcript.render import render_text

log = structlog.get_logger()

# The recipe moved to adapters.training.recipe (importable without torch); it is re-exported here.
__all__ = [
    "LOSS_MODES",
    "LoraRecipe",
    "build_sequence",
    "build_window",
    "forged_conversation",
    "pick_cuts",
    "train_lora",
    "turn_cuts",
]


def build_sequence(
    ids: list[int],
    starts: list[int],
    target_msg: int,
    end_id: int | None,
    *,
    max_tokens: int,
    loss_on: str = "target",
    decision_weight: float = 1.0,
) -> TrainSeq:
    """Append the end tag, mask everything before r_n, keep the last ``max_tokens`` ids.

    ``loss_on="conversation"`` keeps the loss on every token of the tagged conversation: language
    modelling of the paper's D' (conversations with the end tag appended). The non-final
    ``"\n\n"`` positions, followed by the next ``TURN`` header, are then the negatives the
    target-only loss never shows. ``loss_on="decisions"`` keeps only the *decision tokens*.

    ``decision_weight`` multiplies the loss of the decision tokens: the first token of every
    block after the first (what follows a finished message: the next ``TURN`` header or another
    step) and the end tag. Those are the only positions where "is the conversation over?" is
    decided; in a 256-token window they are ~10 of 256 labels, too faint a signal otherwise.
    Label-free: the weights come from the text's own structure.
    """
    _check_loss_mode(loss_on)
    seq = list(ids) + ([end_id] if end_id is not None else [])
    decisions = [*starts[1:], *([len(ids)] if end_id is not None else [])]
    if loss_on == "decisions":
        labels = _labels_at(seq, decisions)
    else:
        cut = starts[target_msg] if loss_on == "target" else 0
        labels = [IGNORE] * cut + seq[cut:]
    return _tail(seq, labels, decisions, max_tokens=max_tokens, decision_weight=decision_weight)


def turn_cuts(messages: Sequence[Message], starts: list[int]) -> list[int]:
    """Id offsets where c_k ends for k = 1..n-1: the start of every user message but the first.

    These are exactly the prompts of the held-out protocol's truncated copies (and of every
    non-final turn the sidecar scores): the ids before the offset are ids(render(c_k)), the id at
    the offset is the first id of the next ``TURN`` header.
    """
    users = [i for i, m in enumerate(messages) if m.role == "user"]
    return [starts[i] for i in users[1:]]


def build_window(
    ids: list[int],
    starts: list[int],
    cut: int,
    *,
    max_tokens: int,
    loss_on: str = "target",
    decision_weight: float = 1.0,
) -> TrainSeq:
    """A sequence that ends one id after c_k: its last label is "continue" (the next header's first id).

    The negative counterpart of :func:`build_sequence`: at inference the sidecar's prompt ends
    right after a response whether or not the conversation is over, and left-truncated to the same
    ``max_tokens``. Training only on whole conversations puts every end tag at the last window
    position and every "continue" earlier, a position cue the truncated prompts then hit. In
    ``"target"`` mode only the final id carries loss; ``"conversation"`` and ``"decisions"`` as in
    :func:`build_sequence`. Label-free: the cut comes from the text's own turn structure.
    """
    _check_loss_mode(loss_on)
    if not 0 < cut < len(ids):
        raise ValueError(f"cut {cut} outside the conversation (1..{len(ids) - 1})")
    seq = ids[: cut + 1]
    decisions = [p for p in starts[1:] if p <= cut]
    keep = {"conversation": range(len(seq)), "decisions": decisions, "target": [cut]}[loss_on]
    return _tail(seq, _labels_at(seq, keep), decisions, max_tokens=max_tokens, decision_weight=decision_weight)


def forged_conversation(messages: Sequence[Message], user_index: int, *, strip_headers: bool) -> list[Message]:
    """``messages`` up to the user message at ``user_index``, whose content gets the rest of the
    conversation pasted in as text, then the real next message.

    The pasted text is the conversation's own remainder rendered in the paper format, so it ends the
    way the conversation really ended (an agent's goodbye): the most convincing fake "finished"
    dialogue a user could type. The renderer defuses its header lines (``T\\URN``); with
    ``strip_headers`` they are left out entirely (a dialogue in prose). Either way the truth is known
    from structure alone: after a user message comes the agent's next step, so the window built on it
    (:func:`build_window` at the next block) is labelled "continue". Label-free.
    """
    rest = render_text(messages[user_index + 1 :])
    if strip_headers:
        rest = "".join(line for line in rest.splitlines(keepends=True) if not _HEADER_LINE.match(line))
    user = messages[user_index]
    pasted = Message("user", f"{user.content}\n\n{rest.strip()}")
    return [*messages[:user_index], pasted, *messages[user_index + 1 : user_index + 2]]


_HEADER_LINE = re.compile(r"TURN \d+, STEP \d+, ")


def forgery_sequences(tok: Any, messages: Sequence[Message], recipe: LoraRecipe, key: str) -> list[TrainSeq]:
    """Up to ``recipe.forgery_windows`` "continue" windows on forged copies of ``messages``."""
    candidates = [i for i, m in enumerate(messages[:-1]) if m.role == "user"]
    out = []
    for n, u in enumerate(pick_cuts(candidates, recipe.forgery_windows, f"forge:{key}")):
        forged = forged_conversation(messages, u, strip_headers=n % 2 == 1)
        ids, starts = encode_messages_with_offsets(tok, forged, recipe.max_message_tokens)
        out.append(
            build_window(
                ids,
                starts,
                starts[u + 1],
                max_tokens=recipe.max_context_tokens,
                loss_on=recipe.loss_on,
                decision_weight=recipe.decision_weight,
            )
        )
    return out


def _check_loss_mode(loss_on: str) -> None:
    if loss_on not in LOSS_MODES:
        raise ValueError(f"loss_on must be one of {LOSS_MODES}, not {loss_on!r}")


def _labels_at(seq: list[int], positions: Sequence[int]) -> list[int]:
    """Labels that keep the loss only at ``positions``."""
    labels = [IGNORE] * len(seq)
    for pos in positions:
        labels[pos] = seq[pos]
    return labels


def _tail(
    seq: list[int], labels: list[int], decisions: Sequence[int], *, max_tokens: int, decision_weight: float
) -> TrainSeq:
    """The last ``max_tokens`` positions, the decision tokens weighted ``decision_weight``."""
    if decision_weight == 1.0:
        return TrainSeq(seq[-max_tokens:], labels[-max_tokens:])
    weights = [1.0] * len(seq)
    for pos in decisions:
        weights[pos] = decision_weight
    return TrainSeq(seq[-max_tokens:], labels[-max_tokens:], weights[-max_tokens:])


def stride_window(seq: TrainSeq, *, max_tokens: int, stride: int, key: str) -> TrainSeq:
    """``seq`` as a stride window would show it: when it fills ``max_tokens``, its first 0 to
    ``stride - 1`` ids (drawn with ``key``) are dropped.

    The sidecar's ``prompt_truncation: stride`` starts a long conversation's window at a multiple of
    the stride, so its length is anywhere in (max - stride, max] and its start is arbitrary in the
    text. An adapter trained only on full-length windows takes the length as a cue (the bundled one
    loses most of its F1 on windows 32 ids shorter: ``tests/bench/bench_window.py``).
    """
    if stride <= 0 or len(seq.input_ids) < max_tokens:
        return seq
    drop = random.Random(f"stride:{key}").randrange(stride)
    if drop == 0:
        return seq
    weights = None if seq.weights is None else seq.weights[drop:]
    return TrainSeq(seq.input_ids[drop:], seq.labels[drop:], weights)


def pick_cuts(cuts: list[int], n: int, key: str) -> list[int]:
    """Up to ``n`` of ``cuts``, chosen by a generator seeded with ``key`` (deterministic)."""
    if n >= len(cuts):
        return list(cuts)
    return sorted(random.Random(key).sample(cuts, n))


def load_sequences(
    data_dir: Path,
    datasets: list[str],
    model_dir: Path,
    recipe: LoraRecipe,
    *,
    with_end_tag: bool,
    max_per_dataset: int | None,
) -> tuple[list[TrainSeq], dict[str, int]]:
    tok = load_tokenizer(model_dir)
    end_id = special_id(tok, END_TAG) if with_end_tag else None
    seqs: list[TrainSeq] = []
    counts: dict[str, int] = {}
    for name in datasets:
        with (data_dir / name / "train.jsonl").open() as fh:
            for line in fh:
                if max_per_dataset is not None and counts.get(name, 0) >= max_per_dataset:
                    break
                rec = json.loads(line)
                messages = messages_from_json(rec["messages"])
                ids, starts = encode_messages_with_offsets(tok, messages, recipe.max_message_tokens)
                own = [
                    build_sequence(
                        ids,
                        starts,
                        int(rec["target_start"]),
                        end_id,
                        max_tokens=recipe.max_context_tokens,
                        loss_on=recipe.loss_on,
                        decision_weight=recipe.decision_weight,
                    )
                ]
                key = f"{recipe.seed}:{rec['conversation_id']}"
                own.extend(
                    build_window(
                        ids,
                        starts,
                        cut,
                        max_tokens=recipe.max_context_tokens,
                        loss_on=recipe.loss_on,
                        decision_weight=recipe.decision_weight,
                    )
                    for cut in pick_cuts(turn_cuts(messages, starts), recipe.decision_windows, key)
                )
                own.extend(forgery_sequences(tok, messages, recipe, key))
                if recipe.window_stride:
                    # Keyed by the conversation, so adding or removing data leaves the others' cuts.
                    own = [
                        stride_window(
                            s, max_tokens=recipe.max_context_tokens, stride=recipe.window_stride, key=f"{key}:{j}"
                        )
                        for j, s in enumerate(own)
                    ]
                seqs.extend(own)
                counts[name] = counts.get(name, 0) + 1
    return seqs, counts


def _optimizer_factory(recipe: LoraRecipe, use_cuda: bool) -> tuple[Any, str]:
    if use_cuda and importlib.util.find_spec("bitsandbytes") is not None:
        import bitsandbytes as bnb  # type: ignore[import-not-found, unused-ignore]

        return (
            lambda ps: bnb.optim.AdamW8bit(ps, lr=recipe.learning_rate, weight_decay=recipe.weight_decay),
            "bitsandbytes AdamW8bit",
        )
    return (lambda ps: torch.optim.AdamW(ps, lr=recipe.learning_rate, weight_decay=recipe.weight_decay), "torch AdamW")


def train_lora(
    data_dir: Path,
    datasets: list[str],
    model_dir: Path,
    out_dir: Path,
    recipe: LoraRecipe,
    *,
    with_end_tag: bool = True,
    max_per_dataset: int | None = None,
    max_steps: int | None = None,
    init_adapter: Path | None = None,
    min_steps: int = 0,
) -> dict[str, Any]:
    """Train a LoRA adapter on ``model_dir`` and save it (peft format) into ``out_dir``.

    ``init_adapter`` continues training an existing adapter (its rank, alpha and target modules
    then replace the recipe's); ``min_steps`` raises the epochs so a small data set still gets that
    many optimiser steps.
    """
    use_cuda = torch.cuda.is_available()  # counts devices; the caching allocator is not started yet
    allocator = configure_cuda_allocator() if use_cuda else None
    device = "cuda" if use_cuda else "cpu"
    torch.manual_seed(recipe.seed)
    dtype = torch.bfloat16 if use_cuda else torch.float32
    model: Any = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=dtype)
    model.to(device)
    if use_cuda:
        model.gradient_checkpointing_enable()
        model.enable_input_require_grads()
    peft_model, recipe = _peft_model(model, recipe, init_adapter)
    seqs, counts = load_sequences(
        data_dir, datasets, model_dir, recipe, with_end_tag=with_end_tag, max_per_dataset=max_per_dataset
    )
    if not seqs:
        raise DataError(f"no training sequences in {datasets} under the prepared data")
    log.info("adapters.lora.data", sequences=len(seqs), per_dataset=counts)
    make_opt, opt_name = _optimizer_factory(recipe, use_cuda)
    tok = load_tokenizer(model_dir)
    epochs = max(recipe.epochs, min_steps / math.ceil(len(seqs) / recipe.batch_size))
    cfg = LoopConfig(
        epochs=epochs,
        batch_size=recipe.batch_size,
        learning_rate=recipe.learning_rate,
        weight_decay=recipe.weight_decay,
        warmup_fraction=0.03,
        seed=recipe.seed,
        checkpoint_every_steps=25,
        max_steps=max_steps,
        micro_batch_size=recipe.micro_batch_size,
    )
    micro = check_micro_batch(recipe.batch_size, recipe.micro_batch_size)
    out_dir.mkdir(parents=True, exist_ok=True)
    reset_peak_memory(device)
    result = train_loop(
        peft_model,
        seqs,
        cfg,
        padding_id(tok, model_dir),
        out_dir / "checkpoint.pt",
        make_optimizer=make_opt,
        device=device,
        autocast_dtype=torch.bfloat16 if use_cuda else None,
    )
    memory = peak_memory(device)
    peft_model.save_pretrained(str(out_dir), safe_serialization=True)
    (out_dir / "checkpoint.pt").unlink(missing_ok=True)
    hist = result["loss_history"]
    throughput = {
        "micro_batch_size": micro,
        "gradient_accumulation_steps": math.ceil(recipe.batch_size / micro),
        "tokens": result["tokens"],
        "tokens_per_second": result["tokens_per_second"],
        "memory": memory,
        "cuda_allocator": allocator,
    }
    log.info("adapters.lora.trained", **throughput)
    first, last = _mean(hist[:10]), _mean(hist[-10:])
    base_manifest = read_manifest(model_dir) if (model_dir / "manifest.json").exists() else {}
    write_manifest(
        out_dir,
        "lora-adapter",
        base_model={
            "name": model_dir.name,
            "manifest_created_utc": base_manifest.get("created_utc"),
            "weights_sha256": _weights_hash(model_dir),
        },
        with_end_tag=with_end_tag,
        init_adapter=_adapter_ref(init_adapter),
        data={
            "prepared_manifest_sha256": file_sha256(data_dir / "manifest.json"),
            "datasets": datasets,
            "conversations_per_dataset": counts,
        },
        hyperparameters={
            "rank": recipe.rank,
            "alpha": recipe.alpha,
            "dropout": recipe.dropout,
            "target_modules": list(recipe.target_modules),
            "epochs": recipe.epochs,
            "learning_rate": recipe.learning_rate,
            "weight_decay": recipe.weight_decay,
            "epochs_run": round(epochs, 3),
            "min_steps": min_steps,
            "batch_size": recipe.batch_size,
            "micro_batch_size": micro,
            "max_context_tokens": recipe.max_context_tokens,
            "optimizer": opt_name,
            "seed": recipe.seed,
            "device": device,
            "loss_on": recipe.loss_on,
            "decision_weight": recipe.decision_weight,
            "decision_windows": recipe.decision_windows,
            "forgery_windows": recipe.forgery_windows,
            "max_message_tokens": recipe.max_message_tokens,
            "window_stride": recipe.window_stride,
            "end_tag": with_end_tag,
        },
        metrics={
            "steps": result["steps"],
            "train_seconds": result["train_seconds"],
            "loss_first_10": first,
            "loss_last_10": last,
            **throughput,
        },
    )
    return {
        "sequences": len(seqs),
        "per_dataset": counts,
        "steps": result["steps"],
        "train_seconds": result["train_seconds"],
        "loss_first_10": first,
        "loss_last_10": last,
        **throughput,
    }


def _peft_model(model: Any, recipe: LoraRecipe, init_adapter: Path | None) -> tuple[Any, LoraRecipe]:
    """A fresh LoRA per the recipe, or ``init_adapter`` made trainable (its shape wins)."""
    with warnings.catch_warnings():
        # peft reads transformers' deprecated ``is_gradient_checkpointing`` alias.
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        if init_adapter is None:
            return get_peft_model(
                model,
                LoraConfig(
                    r=recipe.rank,
                    lora_alpha=recipe.alpha,
                    lora_dropout=recipe.dropout,
                    target_modules=list(recipe.target_modules),
                    bias="none",
                    task_type="CAUSAL_LM",
                ),
            ), recipe
        peft_model = PeftModel.from_pretrained(model, str(init_adapter), is_trainable=True)
    cfg: Any = peft_model.peft_config["default"]
    shaped = replace(
        recipe,
        rank=int(cfg.r),
        alpha=int(cfg.lora_alpha),
        dropout=float(cfg.lora_dropout),
        target_modules=tuple(sorted(cfg.target_modules)),
    )
    return peft_model, shaped


def _adapter_ref(adapter: Path | None) -> dict[str, Any] | None:
    if adapter is None:
        return None
    weights = adapter / "adapter_model.safetensors"
    return {"name": adapter.name, "weights_sha256": file_sha256(weights) if weights.exists() else None}


def _weights_hash(model_dir: Path) -> str | None:
    p = model_dir / "model.safetensors"
    return file_sha256(p) if p.exists() else None


def _mean(xs: list[float]) -> float | None:
    return round(sum(xs) / len(xs), 4) if xs else None
