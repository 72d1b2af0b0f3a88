"""Stable cluster ids across re-clusterings.

New clusters are matched to the previous ones by centroid cosine similarity with the Hungarian
algorithm (maximum total similarity, one-to-one). A new cluster inherits the old id it is matched
to if their similarity is at least ``min_similarity``; otherwise it gets a fresh id. Ids are
``<prefix><number>`` from a counter that only grows, so a retired id is never given to another
cluster. The live component uses a random per-process prefix, so ids stay unique across restarts
and replicas too (the counter is not persisted).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import numpy.typing as npt
from scipy.optimize import linear_sum_assignment  # type: ignore[import-untyped]

from sidecar.clustering.embed import Matrix


class ClusterIdRegistry:
    """Hands out ids; remembers the highest ever issued (persist ``next_number`` to survive restarts)."""

    def __init__(self, next_number: int = 1, prefix: str = "g") -> None:
        if next_number < 1:
            raise ValueError("next_number must be >= 1")
        self.next_number = next_number
        self.prefix = prefix

    def fresh(self) -> str:
        cid = f"{self.prefix}{self.next_number}"
        self.next_number += 1
        return cid

    def match(
        self, old: Mapping[str, npt.NDArray[np.float32]], new_centroids: Matrix, min_similarity: float
    ) -> list[str]:
        """Ids for each row of ``new_centroids`` (unit vectors) given the live clusters ``old``.

        Old ids left unmatched are retired: the counter has moved past them for good.
        """
        k = new_centroids.shape[0]
        ids: list[str | None] = [None] * k
        old_ids = list(old)
        if old_ids and k:
            old_mat = np.stack([np.asarray(old[c], dtype=np.float32) for c in old_ids])
            sim = new_centroids @ old_mat.T
            rows, cols = linear_sum_assignment(-sim)
            for r, c in zip(rows.tolist(), cols.tolist(), strict=True):
                if sim[r, c] >= min_similarity:
                    ids[r] = old_ids[c]
        return [cid if cid is not None else self.fresh() for cid in ids]
