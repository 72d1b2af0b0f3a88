"""Stability and quality figures of a clustering (paper Section 5.2, Figure 4, Table 4)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
from scipy.optimize import linear_sum_assignment  # type: ignore[import-untyped]

from sidecar.clustering.algorithm import IntArray, assign_nearest
from sidecar.clustering.embed import Matrix


def adjusted_rand_index(a: Sequence[Any] | IntArray, b: Sequence[Any] | IntArray) -> float:
    """ARI of two labelings of the same items (1 = identical partitions, ~0 = chance)."""
    from sklearn.metrics import adjusted_rand_score

    return float(adjusted_rand_score(list(a), list(b)))


def aligned_confusion(a: IntArray, b: IntArray) -> tuple[npt.NDArray[np.int64], list[int], list[int]]:
    """Figure 4's matrix: D[i, j] = items in cluster i of run 1 and cluster j of run 2.

    Rows and columns are permuted so the largest one-to-one overlaps sit on the diagonal (Hungarian
    on -D), matched pairs sorted by overlap; unmatched rows/columns follow. Returns the matrix and
    the original cluster ids of its rows and columns.
    """
    ka, kb = int(a.max()) + 1, int(b.max()) + 1
    mat = np.zeros((ka, kb), dtype=np.int64)
    np.add.at(mat, (a, b), 1)
    rows, cols = linear_sum_assignment(-mat)
    pairs = sorted(zip(rows.tolist(), cols.tolist(), strict=True), key=lambda p: -mat[p[0], p[1]])
    row_order = [r for r, _ in pairs] + [r for r in range(ka) if r not in set(rows.tolist())]
    col_order = [c for _, c in pairs] + [c for c in range(kb) if c not in set(cols.tolist())]
    return mat[np.ix_(row_order, col_order)], row_order, col_order


def diagonal_fraction(mat: npt.NDArray[np.int64]) -> float:
    """Share of items on the diagonal of an aligned confusion matrix."""
    total = int(mat.sum())
    return float(np.trace(mat[: min(mat.shape), : min(mat.shape)]) / total) if total else 0.0


def mean_distance(vectors: Matrix, assignments: IntArray, centroids: Matrix) -> float:
    """Mean Euclidean distance of each vector to its own cluster's centroid (Table 4's figure)."""
    if len(vectors) == 0:
        return float("nan")
    diff = vectors - centroids[assignments]
    return float(np.linalg.norm(diff, axis=1).mean())


def nearest_distance(vectors: Matrix, centroids: Matrix) -> float:
    """Mean distance of unseen vectors to the nearest centroid (Table 4's test column)."""
    if len(vectors) == 0:
        return float("nan")
    _, dist = assign_nearest(vectors, centroids)
    return float(dist.mean())


def plot_confusion(mat: npt.NDArray[np.int64], title: str, path: str) -> None:
    """Write the aligned confusion matrix as a PNG (needs matplotlib)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 4.5), dpi=110)
    shown = np.log1p(mat.astype(np.float64))
    ax.imshow(shown, cmap="viridis", aspect="auto")
    ax.set_xlabel("run 2 cluster (aligned)")
    ax.set_ylabel("run 1 cluster (aligned)")
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
