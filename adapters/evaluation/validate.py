"""``adapters validate``: the held-out protocol on train-side conversations no adapter trained on.

Choosing a recipe (loss, learning rate, windows) must never look at the test side. This command
builds the same examples ``prepare`` builds for the test side (every conversation complete, plus a
copy truncated after a uniform earlier turn, incomplete) from *train-side* conversations beyond the
first ``--skip`` of each dataset (``train-lora`` takes the first ``--max-per-dataset``), and scores
them in-process with transformers + peft in float32 on the same ids the sidecar sends. No server,
so it is quick enough for a recipe sweep; the committed figures still come from ``adapters eval``
through vLLM.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import structlog
import torch
from tqdm import tqdm

from adapters.data.conversations import eval_examples, in_truncation_protocol, train_record_conversation
from adapters.data.tokenizer import END_TAG, encode_messages, load_tokenizer, padding_id, special_id
from adapters.evaluation.metrics import binary_metrics
from adapters.serving.manifest import message_cap

log = structlog.get_logger()


def validation_examples(
    data_dir: Path, dataset: str, *, skip: int, limit: int | None, seed: int = 0
) -> list[tuple[list[Any], bool]]:
    """(messages, complete) pairs from train-side conversations ``skip..skip+limit`` of ``dataset``."""
    out: list[tuple[list[Any], bool]] = []
    with (data_dir / dataset / "train.jsonl").open() as fh:
        for i, line in enumerate(fh):
            if i < skip:
                continue
            if limit is not None and i >= skip + limit:
                break
            conv = train_record_conversation(json.loads(line), dataset)
            # As for the test side: a conversation the dataset marks as not completed is no positive.
            if not in_truncation_protocol(conv.real_complete, conv.real_label_source):
                continue
            out.extend((list(ex.messages), ex.complete) for ex in eval_examples(conv, seed))
    return out


def load_model(base: Path, adapter: Path | None) -> Any:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    # On a GPU (a real base): bfloat16 on the device, as vLLM serves it there; on a CPU, float32.
    cuda = torch.cuda.is_available()
    model: Any = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.bfloat16 if cuda else torch.float32)
    if cuda:
        model.to("cuda")
    if adapter is not None:
        with warnings.catch_warnings():
            # peft reads transformers' deprecated ``is_gradient_checkpointing`` alias.
            warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
            model = PeftModel.from_pretrained(model, str(adapter))
    model.eval()
    return model


@torch.inference_mode()
def next_token_probs(
    model: Any, prompts: Sequence[list[int]], want: int, pad_id: int, *, batch_size: int = 16, desc: str = "score"
) -> tuple[list[float], list[int]]:
    """P(``want``) and the greedy id at the position after each prompt (right-padded batches)."""
    probs: list[float] = []
    greedy: list[int] = []
    for b in tqdm(range(0, len(prompts), batch_size), desc=desc, unit="batch", leave=False):
        batch = prompts[b : b + batch_size]
        width = max(len(p) for p in batch)
        ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for i, prompt in enumerate(batch):
            ids[i, : len(prompt)] = torch.tensor(prompt)
            mask[i, : len(prompt)] = 1
        device = next(model.parameters()).device
        logits = model(input_ids=ids.to(device), attention_mask=mask.to(device)).logits
        last = torch.tensor([len(p) - 1 for p in batch], device=device)
        rows = logits[torch.arange(len(batch), device=device), last].float()
        dist = torch.softmax(rows, dim=-1)
        probs.extend(dist[:, want].tolist())
        greedy.extend(rows.argmax(dim=-1).tolist())
    return probs, greedy


def run_validate(
    data_dir: Path,
    datasets: Sequence[str],
    base: Path,
    adapter: Path | None,
    *,
    skip: int,
    limit: int | None,
    max_context_tokens: int,
) -> dict[str, Any]:
    tok = load_tokenizer(base)
    end_id, pad_id = special_id(tok, END_TAG), padding_id(tok, base)
    model = load_model(base, adapter)
    out: dict[str, Any] = {}
    for name in datasets:
        exs = validation_examples(data_dir, name, skip=skip, limit=limit)
        if not exs:
            log.warning("adapters.validate.empty", dataset=name, skip=skip)
            continue
        prompts = [encode_messages(tok, m, message_cap(adapter))[-max_context_tokens:] for m, _ in exs]
        labels = [y for _, y in exs]
        p_end, greedy = next_token_probs(model, prompts, end_id, pad_id, desc=name)
        m = binary_metrics(labels, [g == end_id for g in greedy], p_end)
        out[name] = {
            "examples": len(exs),
            "f1_complete": m["complete"]["f1"],
            "roc_auc": m["roc_auc"],
            "accuracy": m["accuracy"],
            "confusion": m["confusion"],
        }
        log.info("adapters.validate.done", dataset=name, **out[name])
    return {
        "adapter": str(adapter) if adapter else None,
        "skip": skip,
        "limit": limit,
        "max_context_tokens": max_context_tokens,
        "results": out,
    }
