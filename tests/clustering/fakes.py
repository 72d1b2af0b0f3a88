"""Deterministic stand-ins for fast unit tests (the real parts are tested elsewhere)."""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from collections.abc import Callable, Sequence

import numpy as np

from sidecar.clustering.embed import Matrix, normalize_rows
from sidecar.clustering.llm import MergeQuery, extractive_summary
from sidecar.transcript.model import Message

_TAG = re.compile(r"\bg(\d+)\b")


class HashEmbedder:
    """Bag of words hashed into ``dim`` buckets: texts sharing words are close."""

    def __init__(self, dim: int = 64) -> None:
        self.dim = dim
        self.calls = 0

    def embed(self, texts: Sequence[str]) -> Matrix:
        self.calls += 1
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for r, t in enumerate(texts):
            for w in t.lower().split():
                h = int.from_bytes(hashlib.sha256(w.encode()).digest()[:4], "little")
                out[r, h % self.dim] += 1.0
        return normalize_rows(out)


def majority_tag(texts: Sequence[str]) -> str:
    tags = Counter(m.group(0) for t in texts for m in _TAG.finditer(t))
    return tags.most_common(1)[0][0] if tags else "none"


class OracleLLM:
    """Describes a group by its majority ``gN`` tag; merges iff the two majorities agree.

    ``decide`` overrides the merge decision (deterministic decision functions for the loop tests).
    """

    def __init__(self, decide: Callable[[MergeQuery], bool] | None = None, describe_examples: int = 10) -> None:
        self.decide = decide
        self.queries: list[MergeQuery] = []
        self.describes: list[tuple[list[str], list[str], str | None]] = []
        self._examples = describe_examples

    @property
    def describe_examples(self) -> int:
        return self._examples

    async def summarize(self, transcript: Sequence[Message]) -> str:
        return extractive_summary(transcript, 600)

    async def describe(self, group: Sequence[str], not_in_group: Sequence[str], previous: str | None = None) -> str:
        self.describes.append((list(group), list(not_in_group), previous))
        return f"goal {majority_tag(group)}"

    async def should_merge(self, query: MergeQuery) -> bool:
        self.queries.append(query)
        if self.decide is not None:
            return self.decide(query)
        return majority_tag(query.group1) == majority_tag(query.group2)


def blobs(
    groups: int, per_group: int, dim: int = 32, spread: float = 0.15, seed: int = 0
) -> tuple[list[str], Matrix, list[int]]:
    """``groups`` well separated clusters of unit vectors; texts carry their group tag."""
    rng = np.random.default_rng(seed)
    centers = normalize_rows(rng.normal(size=(groups, dim)))
    texts, rows, truth = [], [], []
    for g in range(groups):
        for i in range(per_group):
            rows.append(centers[g] + spread * rng.normal(size=dim) / np.sqrt(dim))
            texts.append(f"g{g} item {i}")
            truth.append(g)
    return texts, normalize_rows(np.array(rows)), truth
