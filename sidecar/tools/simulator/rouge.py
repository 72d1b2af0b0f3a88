"""ROUGE-1, ROUGE-2 and ROUGE-L (Lin, 2004): the simulator paper's extrinsic check of a summary.

Semantics of the reference ``rouge-score`` package's default scorer (no stemming), which is what
OptimouseQuest's published scores use (``tests/simulator/test_rouge.py`` reproduces them):

* tokens: the text lower-cased, every run of characters other than ``a-z`` and ``0-9`` replaced
  by one space, split on whitespace (so ``"Don't"`` gives ``don`` and ``t``, and non-ASCII letters
  separate words);
* ROUGE-N: clipped n-gram overlap (each n-gram counts at most as often as in the other text);
  precision = overlap / n-grams of the prediction, recall = overlap / n-grams of the target;
* ROUGE-L: the longest common subsequence of the token lists, over the prediction's and the
  target's lengths (sentence-level ROUGE-L, not the summary-level ``rougeLsum``);
* F-measure = 2PR / (P + R), and 0 when P + R = 0 (an empty text scores 0, never a division error).

The target is the hidden goal, the prediction the assistant's final summary.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from sidecar.tools.classification import f_measure

_NON_ALNUM = re.compile(r"[^a-z0-9]+")


def tokenize(text: str) -> list[str]:
    """``rouge-score``'s default tokenisation (see the module docstring)."""
    return _NON_ALNUM.sub(" ", text.lower()).split()


@dataclass(frozen=True, slots=True)
class Score:
    """Precision, recall and F-measure of one ROUGE variant."""

    precision: float
    recall: float
    fmeasure: float


def _score(overlap: int, predicted: int, target: int) -> Score:
    p = overlap / predicted if predicted else 0.0
    r = overlap / target if target else 0.0
    return Score(p, r, f_measure(p, r))


def _ngrams(tokens: Sequence[str], n: int) -> Counter[tuple[str, ...]]:
    return Counter(tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1))


def rouge_n_tokens(target: Sequence[str], prediction: Sequence[str], n: int) -> Score:
    """ROUGE-N of two token lists."""
    if n < 1:
        raise ValueError(f"n must be at least 1, not {n}")
    t, p = _ngrams(target, n), _ngrams(prediction, n)
    return _score(sum((t & p).values()), sum(p.values()), sum(t.values()))


def lcs_length(a: Sequence[str], b: Sequence[str]) -> int:
    """Length of the longest common subsequence (O(len(a) * len(b)) time, O(len(b)) memory)."""
    if len(b) > len(a):
        a, b = b, a
    prev = [0] * (len(b) + 1)
    for x in a:
        cur = [0] * (len(b) + 1)
        for j, y in enumerate(b, start=1):
            cur[j] = prev[j - 1] + 1 if x == y else max(prev[j], cur[j - 1])
        prev = cur
    return prev[-1]


def rouge_l_tokens(target: Sequence[str], prediction: Sequence[str]) -> Score:
    """Sentence-level ROUGE-L of two token lists."""
    return _score(lcs_length(target, prediction), len(prediction), len(target))


def rouge(target: str, prediction: str) -> dict[str, Score]:
    """``{"rouge1", "rouge2", "rougeL"}`` of ``prediction`` (the summary) against ``target`` (the goal)."""
    t, p = tokenize(target), tokenize(prediction)
    return {"rouge1": rouge_n_tokens(t, p, 1), "rouge2": rouge_n_tokens(t, p, 2), "rougeL": rouge_l_tokens(t, p)}


def as_json(scores: dict[str, Score]) -> dict[str, dict[str, float]]:
    """Scores as plain JSON: ``{"rouge1": {"precision", "recall", "fmeasure"}, ...}``."""
    return {k: {"precision": s.precision, "recall": s.recall, "fmeasure": s.fmeasure} for k, s in scores.items()}
