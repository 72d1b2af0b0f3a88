"""Precision, recall and F1: the one implementation, used by ``sidecar eval``, ``sidecar judge``,
the simulator's ROUGE and ``adapters`` evaluation and calibration; and the one bootstrap over
conversations that puts intervals on such figures.

Undefined ratios are None (no predicted positives: precision; no true positives: recall; either:
F1), and each caller says what it reports instead. F1 is computed from the counts,
``2tp / (2tp + fp + fn)``, so it is exact whenever precision and recall are defined.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # numpy is loaded by the bootstrap only: the F1 helpers stay light to import
    import numpy as np
    import numpy.typing as npt


@dataclass(frozen=True, slots=True)
class Confusion:
    """Counts of a binary classification, True being the positive class."""

    tp: int
    fp: int
    fn: int
    tn: int

    @property
    def n(self) -> int:
        return self.tp + self.fp + self.fn + self.tn


def confusion(labels: Sequence[bool], predictions: Sequence[bool]) -> Confusion:
    """The confusion counts; raises ValueError when the sequences differ in length."""
    if len(labels) != len(predictions):
        raise ValueError(f"{len(labels)} labels for {len(predictions)} predictions")
    pairs = list(zip(labels, predictions, strict=True))
    tp = sum(1 for y, p in pairs if y and p)
    fp = sum(1 for y, p in pairs if not y and p)
    fn = sum(1 for y, p in pairs if y and not p)
    return Confusion(tp, fp, fn, len(pairs) - tp - fp - fn)


def precision_recall_f1(tp: int, fp: int, fn: int) -> tuple[float | None, float | None, float | None]:
    """(precision, recall, F1) of the positive class; None where a ratio is undefined."""
    precision = tp / (tp + fp) if tp + fp else None
    recall = tp / (tp + fn) if tp + fn else None
    f1 = 2 * tp / (2 * tp + fp + fn) if precision is not None and recall is not None else None
    return precision, recall, f1


def f_measure(precision: float, recall: float) -> float:
    """The harmonic mean of a precision and a recall given as ratios (0.0 when both are 0)."""
    return 2 * precision * recall / (precision + recall) if precision + recall > 0 else 0.0


def grouped_bootstrap(
    groups: Sequence[str], statistic: Callable[[npt.NDArray[np.intp]], float | None], rounds: int, seed: int = 0
) -> list[float]:
    """Bootstrap samples of ``statistic`` that resample whole groups (conversations), not rows: the
    turns or copies of one conversation are not independent samples.

    Each round draws as many groups as there are, with replacement, and calls ``statistic`` with
    the row indices of the drawn groups (a group drawn twice appears twice); a round it answers
    None for (a draw with one class only, say) is left out. The same ``seed`` draws the same rounds,
    so two statistics computed with one seed are paired."""
    import numpy as np

    if rounds < 1:
        raise ValueError(f"rounds must be at least 1, not {rounds}")
    if not groups:
        return []
    ids, inverse = np.unique(np.asarray(groups), return_inverse=True)
    members = [np.flatnonzero(inverse == k) for k in range(len(ids))]
    rng = np.random.default_rng(seed)
    out: list[float] = []
    for _ in range(rounds):
        value = statistic(np.concatenate([members[k] for k in rng.integers(0, len(ids), len(ids))]))
        if value is not None:
            out.append(value)
    return out
