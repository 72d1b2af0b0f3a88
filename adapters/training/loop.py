"""Shared training loop: padded batches, loss on labelled positions, gradient accumulation, resumable checkpoints."""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog
import torch
from tqdm import tqdm

from adapters.training.recipe import check_micro_batch

log = structlog.get_logger()

IGNORE = -100


@dataclass(frozen=True, slots=True)
class TrainSeq:
    """One training sequence: ``input_ids`` and ``labels`` (IGNORE where no loss is taken)."""

    input_ids: list[int]
    labels: list[int]
    weights: list[float] | None = None  # per-label loss weights; None = plain mean


@dataclass(frozen=True, slots=True)
class LoopConfig:
    epochs: float
    batch_size: int
    learning_rate: float
    weight_decay: float
    warmup_fraction: float
    seed: int
    checkpoint_every_steps: int
    grad_clip: float = 1.0
    max_steps: int | None = None
    micro_batch_size: int | None = None  # None: the whole batch in one pass (see accumulate_gradients)


def set_seed(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)


def collate(batch: Sequence[TrainSeq], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-pad a batch; padding has attention 0 and label IGNORE."""
    width = max(len(s.input_ids) for s in batch)
    ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    labels = torch.full((len(batch), width), IGNORE, dtype=torch.long)
    mask = torch.zeros((len(batch), width), dtype=torch.long)
    weights = torch.zeros((len(batch), width), dtype=torch.float32)
    for i, s in enumerate(batch):
        n = len(s.input_ids)
        ids[i, :n] = torch.tensor(s.input_ids)
        labels[i, :n] = torch.tensor(s.labels)
        mask[i, :n] = 1
        weights[i, :n] = torch.tensor(s.weights) if s.weights is not None else 1.0
    out = {"input_ids": ids, "labels": labels, "attention_mask": mask}
    if any(s.weights is not None for s in batch):
        out["weights"] = weights
    return out


def weighted_lm_loss(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Next-token cross-entropy, each label weighted; IGNORE labels count for nothing."""
    return lm_loss_sum(model, batch) / loss_weight(batch).clamp_min(1e-6)


def loss_weight(batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """The denominator of the batch's mean loss: the summed weight of its labelled positions.

    Unweighted, that is the number of labelled positions after the shift (what a Hugging Face
    model's own ``loss`` averages over); with weights, their sum there (``weighted_lm_loss``).
    """
    labelled = batch["labels"][:, 1:] != IGNORE
    if "weights" not in batch:
        return labelled.sum().float()
    return (batch["weights"][:, 1:] * labelled).sum()


def lm_loss_sum(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """The weighted *sum* of next-token cross-entropies (weights 1 when the batch has none)."""
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    labels = batch["labels"][:, 1:]
    labelled = labels != IGNORE
    weights = batch["weights"][:, 1:] * labelled if "weights" in batch else labelled.float()
    ce = torch.nn.functional.cross_entropy(
        logits[:, :-1].reshape(-1, logits.shape[-1]).float(),
        labels.reshape(-1),
        ignore_index=IGNORE,
        reduction="none",
    )
    return (ce * weights.reshape(-1)).sum()


def accumulate_gradients(
    model: torch.nn.Module,
    batch: Sequence[TrainSeq],
    pad_id: int,
    micro_batch_size: int,
    *,
    device: str = "cpu",
    autocast_dtype: torch.dtype | None = None,
) -> float:
    """Backpropagate ``batch`` in slices of ``micro_batch_size``; returns the batch's mean loss.

    The loss is a mean over the whole batch's labelled positions (weighted), so every slice's
    summed loss is divided by the *batch's* total weight, not its own: the gradients then add up to
    exactly the full batch's, whatever the slices hold (an uneven last slice, slices with more or
    fewer labels). Averaging per-slice means instead would weight a label by its slice's size.
    """
    denominator = float(loss_weight(collate(batch, pad_id)).clamp_min(1e-6))
    total = 0.0
    for start in range(0, len(batch), micro_batch_size):
        inputs = {k: v.to(device) for k, v in collate(batch[start : start + micro_batch_size], pad_id).items()}
        with torch.autocast(
            device_type=device.split(":", maxsplit=1)[0], dtype=autocast_dtype, enabled=autocast_dtype is not None
        ):
            loss_sum = lm_loss_sum(model, inputs)
        torch.autograd.backward(loss_sum / denominator)
        total += float(loss_sum.detach())
    return total / denominator


def _batches(data: Sequence[TrainSeq], batch_size: int, epoch: int, seed: int) -> list[list[TrainSeq]]:
    # Shuffle, then group similar lengths inside windows of 32 batches to waste less padding.
    order = list(range(len(data)))
    random.Random(seed * 1000 + epoch).shuffle(order)
    window = batch_size * 32
    out: list[list[TrainSeq]] = []
    for w in range(0, len(order), window):
        chunk = sorted(order[w : w + window], key=lambda i: len(data[i].input_ids))
        out.extend([data[i] for i in chunk[b : b + batch_size]] for b in range(0, len(chunk), batch_size))
    random.Random(seed * 7 + epoch).shuffle(out)
    return out


def train_loop(
    model: torch.nn.Module,
    data: Sequence[TrainSeq],
    cfg: LoopConfig,
    pad_id: int,
    checkpoint_path: Path,
    *,
    make_optimizer: Callable[[list[torch.nn.Parameter]], torch.optim.Optimizer],
    device: str = "cpu",
    autocast_dtype: torch.dtype | None = None,
) -> dict[str, Any]:
    """Train; resume from ``checkpoint_path`` if it exists. Returns loss history, timings, throughput.

    ``tokens`` counts the input ids trained on by this call (padding excluded; after a resume, only
    the steps run now); ``tokens_per_second`` divides it by this call's training time.
    """
    micro = check_micro_batch(cfg.batch_size, cfg.micro_batch_size)
    set_seed(cfg.seed)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = make_optimizer(params)
    steps_per_epoch = math.ceil(len(data) / cfg.batch_size)
    total = max(1, math.ceil(steps_per_epoch * cfg.epochs))
    if cfg.max_steps is not None:
        total = min(total, cfg.max_steps)
    warmup = max(1, int(total * cfg.warmup_fraction))

    def lr_at(step: int) -> float:
        if step < warmup:
            return cfg.learning_rate * (step + 1) / warmup
        return cfg.learning_rate * max(0.0, (total - step) / max(1, total - warmup))

    step = 0
    history: list[float] = []
    if checkpoint_path.exists():
        state = torch.load(checkpoint_path, map_location=device, weights_only=False)
        model.load_state_dict(state["model"], strict=False)
        opt.load_state_dict(state["optimizer"])
        step, history = int(state["step"]), list(state["history"])
        log.info("adapters.train.resumed", step=step)
    model.train()
    tokens = 0
    t0 = time.monotonic()
    bar = tqdm(total=total, initial=step, desc="train", unit="step")
    epoch = step // steps_per_epoch
    while step < total:
        batches = _batches(data, cfg.batch_size, epoch, cfg.seed)
        for batch in batches[step - epoch * steps_per_epoch :]:
            if step >= total:
                break
            for g in opt.param_groups:
                g["lr"] = lr_at(step)
            loss = accumulate_gradients(model, batch, pad_id, micro, device=device, autocast_dtype=autocast_dtype)
            tokens += sum(len(seq.input_ids) for seq in batch)
            torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
            opt.step()
            opt.zero_grad(set_to_none=True)
            history.append(loss)
            step += 1
            bar.update(1)
            bar.set_postfix(loss=f"{sum(history[-20:]) / len(history[-20:]):.3f}")
            if step % cfg.checkpoint_every_steps == 0 and step < total:
                _save(checkpoint_path, model, opt, step, history)
        epoch += 1
    bar.close()
    seconds = time.monotonic() - t0
    return {
        "steps": step,
        "loss_history": history,
        "train_seconds": round(seconds, 1),
        "tokens": tokens,
        "tokens_per_second": round(tokens / seconds, 1) if tokens else 0.0,
    }


def _save(path: Path, model: torch.nn.Module, opt: torch.optim.Optimizer, step: int, history: list[float]) -> None:
    names = {n for n, p in model.named_parameters() if p.requires_grad}
    trainable = {k: v for k, v in model.state_dict().items() if k in names}
    tmp = path.with_suffix(".tmp")
    torch.save({"model": trainable, "optimizer": opt.state_dict(), "step": step, "history": history}, tmp)
    tmp.replace(path)
