"""``adapters prepare``: conversations (any source) -> per-data-set train conversations and test examples."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import structlog
from tqdm import tqdm

from adapters.data.conversations import (
    Conversation,
    eval_examples,
    in_truncation_protocol,
    split_of,
    stable_unit,
    target_start,
)
from adapters.data.sources import FileSource, Source, explain
from adapters.data.tokenizer import END_TAG, SPECIAL_TOKENS
from adapters.errors import DataError
from adapters.serving.manifest import write_manifest
from sidecar.transcript.dataset import message_json
from sidecar.transcript.render import render_text

log = structlog.get_logger()


def sft_pair(conv: Conversation, with_end_tag: bool = True) -> dict[str, str]:
    """The paper's pair as text: input = render(p_1..p_n), target = r_n (+ the end tag).

    Rendering escapes special-token strings inside content, so the end tag appears exactly once,
    at the end of the target.
    """
    ts = target_start(conv.messages)
    full = render_text(conv.messages, forbidden=SPECIAL_TOKENS)
    head = render_text(conv.messages[:ts], forbidden=SPECIAL_TOKENS)
    return {"input": head, "target": full[len(head) :] + (END_TAG if with_end_tag else "")}


def _sample(convs: list[Conversation], cap: int | None, salt: str) -> list[Conversation]:
    ordered = sorted(convs, key=lambda c: stable_unit(c.conversation_id, salt))
    return ordered if cap is None else ordered[:cap]


def prepare_dataset(
    source: Path | Source, out_dir: Path, *, seed: int, max_train: int | None, max_test: int | None
) -> dict[str, Any]:
    """Split one data set, write ``train.jsonl`` (SFT conversations) and ``test.jsonl``.

    ``source`` is a :class:`~adapters.data.sources.Source` or a JSONL file (named after its directory).
    Raises :class:`~adapters.errors.DataError` when no conversation with a user message is left.
    """
    if isinstance(source, Path):
        source = FileSource(source.parent.name, (source,), str(source))
    name = source.name
    train: list[Conversation] = []
    test: list[Conversation] = []
    no_user = 0
    for conv in tqdm(source.conversations(), desc=f"read {name}", unit="conv", leave=False):
        if not any(m.role == "user" for m in conv.messages):
            no_user += 1
            continue
        (train if split_of(conv) == "train" else test).append(conv)
    if not train and not test:
        raise DataError(explain(source.stats, name, no_user))
    train_s = _sample(train, max_train, "train-sample")
    proto_pool = [c for c in test if in_truncation_protocol(c.real_complete, c.real_label_source)]
    test_s = _sample(proto_pool, max_test, "test-sample")
    out_dir.mkdir(parents=True, exist_ok=True)
    with (out_dir / "train.jsonl").open("w") as fh:
        for c in train_s:
            rec = {
                "conversation_id": c.conversation_id,
                "dataset": name,
                "messages": [message_json(m) for m in c.messages],
                "target_start": target_start(c.messages),
                "real_complete": c.real_complete,
                "real_label_source": c.real_label_source,
                **sft_pair(c),
            }
            fh.write(json.dumps(rec, ensure_ascii=False) + "\n")
    n_ex = 0
    with (out_dir / "test.jsonl").open("w") as fh:
        for c in test_s:
            for ex in eval_examples(c, seed):
                rec = _example_json(
                    ex.conversation_id,
                    name,
                    ex.messages,
                    complete=ex.complete,
                    kind=ex.kind,
                    label_source="protocol",
                    extra=ex.extra,
                )
                fh.write(json.dumps(rec, ensure_ascii=False) + "\n")
                n_ex += 1
    real_s = _real_label_sample(test, max_test)
    with (out_dir / "test_real.jsonl").open("w") as fh:
        for c in real_s:
            rec = _example_json(
                c.conversation_id,
                name,
                c.messages,
                complete=bool(c.real_complete),
                kind="full",
                label_source=c.real_label_source or "",
                extra={},
            )
            fh.write(json.dumps(rec, ensure_ascii=False) + "\n")
    return {
        "dataset": name,
        "source": source.describe(),
        "without_user_message": no_user,
        "train_side": len(train),
        "test_side": len(test),
        "train_used": len(train_s),
        "test_conversations_used": len(test_s),
        "test_examples": n_ex,
        "real_label_examples": len(real_s),
    }


def _real_label_sample(test: list[Conversation], cap: int | None) -> list[Conversation]:
    """Full test-side conversations a dataset labels itself: every negative, positives up to ``cap``."""
    neg = [c for c in test if c.real_complete is False]
    pos = [c for c in test if c.real_complete is True]
    if cap is not None:
        pos = _sample(pos, max(cap - len(neg), len(neg)), "real")
    return neg + pos


def _example_json(
    cid: str,
    dataset: str,
    messages: Sequence[Any],
    *,
    complete: bool,
    kind: str,
    label_source: str,
    extra: dict[str, Any],
) -> dict[str, Any]:
    return {
        "conversation_id": cid,
        "dataset": dataset,
        "complete": complete,
        "kind": kind,
        "label_source": label_source,
        "extra": extra,
        "messages": [message_json(m) for m in messages],
    }


def prepare(
    sources: Sequence[Source], out_dir: Path, *, seed: int, max_train: int | None, max_test: int | None
) -> dict[str, Any]:
    """Prepare every source under ``out_dir/<name>/`` and write the manifest."""
    names = [s.name for s in sources]
    if len(set(names)) != len(names):
        raise DataError(f"two sources share a name: {names}; name them with NAME=SPEC")
    stats = []
    for source in sources:
        stats.append(prepare_dataset(source, out_dir / source.name, seed=seed, max_train=max_train, max_test=max_test))
        log.info("adapters.prepare.dataset", **{k: v for k, v in stats[-1].items() if k != "source"})
    write_manifest(
        out_dir,
        "prepared-data",
        seed=seed,
        max_train_per_dataset=max_train,
        max_test_conversations_per_dataset=max_test,
        datasets=stats,
        split="sha256(split_group) 50/50",
        truncation="k ~ U{1..n-1}, seeded by conversation id",
    )
    return {"datasets": stats}
