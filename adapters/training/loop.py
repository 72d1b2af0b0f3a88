"""Shared training loop: padded batches, loss on labelled positions, resumable checkpoints."""

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
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    labels = batch["labels"][:, 1:]
    weights = batch["weights"][:, 1:] * (labels != IGNORE)
    ce = torch.nn.functional.cross_entropy(
        logits[:, :-1].reshape(-1, logits.shape[-1]).float(),
        labels.reshape(-1),
        ignore_index=IGNORE,
        reduction="none",
    )
    return (ce * weights.reshape(-1)).sum() / weights.sum().clamp_min(1e-6)


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
    """Train; resume from ``checkpoint_path`` if it exists. Returns loss history and timings."""
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
            inputs = {k: v.to(device) for k, v in collate(batch, pad_id).items()}
            with torch.autocast(
                device_type=device.split(":", maxsplit=1)[0], dtype=autocast_dtype, enabled=autocast_dtype is not None
            ):
                loss = weighted_lm_loss(model, inputs) if "weights" in inputs else model(**inputs).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
            opt.step()
            opt.zero_grad(set_to_none=True)
            history.append(float(loss.detach()))
            step += 1
            bar.update(1)
            bar.set_postfix(loss=f"{sum(history[-20:]) / len(history[-20:]):.3f}")
            if step % cfg.checkpoint_every_steps == 0 and step < total:
                _save(checkpoint_path, model, opt, step, history)
        epoch += 1
    bar.close()
    return {"steps": step, "loss_history": history, "train_seconds": round(time.monotonic() - t0, 1)}


def _save(path: Path, model: torch.nn.Module, opt: torch.optim.Optimizer, step: int, history: list[float]) -> None:
    names = {n for n, p in model.named_parameters() if p.requires_grad}
    trainable = {k: v for k, v in model.state_dict().items() if k in names}
    tmp = path.with_suffix(".tmp")
    torch.save({"model": trainable, "optimizer": opt.state_dict(), "step": step, "history": history}, tmp)
    tmp.replace(path)
