"""Fixtures for the adapters tests: a tiny tokenizer trained on synthetic dialogues."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest
from tokenizers import Tokenizer

from adapters.data.tokenizer import train_tokenizer
from sidecar.transcript.model import Message
from sidecar.transcript.render import render_text

WORDS = (
    "book",
    "a",
    "table",
    "for",
    "two",
    "tonight",
    "thanks",
    "bye",
    "hotel",
    "train",
    "to",
    "cambridge",
    "is",
    "there",
    "anything",
    "else",
    "no",
    "that",
    "is",
    "all",
    "sure",
    "done",
    "what",
    "time",
)


def synthetic_conversation(i: int, n_turns: int) -> dict[str, Any]:
    turns: list[dict[str, Any]] = []
    for t in range(n_turns):
        w = [WORDS[(i * 7 + t * 3 + k) % len(WORDS)] for k in range(5)]
        turns.append({"role": "user", "content": " ".join(w) + "?"})
        if t == n_turns - 1:
            turns.append({"role": "assistant", "content": "you are welcome, goodbye."})
        else:
            turns.append({"role": "assistant", "content": "sure, " + " ".join(reversed(w)) + "."})
    return {
        "conversation_id": f"toy/{i}",
        "source": "toy",
        "domain": "",
        "turns": turns,
        "meta": {"split_group": f"g{i}", "goal": "SECRET-GOAL-TEXT"},
    }


def to_messages(rec: dict[str, Any]) -> list[Message]:
    return [Message(role=t["role"], content=t["content"]) for t in rec["turns"]]


@pytest.fixture(scope="session")
def toy_records() -> list[dict[str, Any]]:
    return [synthetic_conversation(i, 2 + i % 4) for i in range(60)]


@pytest.fixture(scope="session")
def toy_tokenizer(toy_records: list[dict[str, Any]]) -> Tokenizer:
    return train_tokenizer((render_text(to_messages(r)) for r in toy_records), vocab_size=400)


@pytest.fixture
def toy_dataset_file(tmp_path: Path, toy_records: list[dict[str, Any]]) -> Path:
    d = tmp_path / "datasets" / "toy"
    d.mkdir(parents=True)
    path = d / "dev.jsonl.gz"
    with gzip.open(path, "wt", encoding="utf-8") as fh:
        for r in toy_records:
            fh.write(json.dumps(r) + "\n")
    return path
