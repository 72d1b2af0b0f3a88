"""The live goal model: which goal clusters exist, their stable ids, names and centroids.

:class:`GoalModel` holds the clusters of the last re-clustering and answers two questions: which
cluster a new conversation belongs to (:meth:`GoalModel.nearest`, its embedding against the
centroids) and what goal value metrics show for a cluster (:meth:`GoalModel.goal_of`). A
re-clustering result replaces the whole table at once (:meth:`GoalModel.apply`): new clusters take
the ids of the old ones they match (:class:`~sidecar.clustering.ids.ClusterIdRegistry`), so a goal
renamed by a re-clustering keeps its series.

The goal value on metrics is a stable cluster id, never text: the ids of the ``top_n_labels``
largest clusters, ``other`` for the rest, ``unknown`` for no cluster. Names are published beside
the ids, and only for clusters of at least ``min_conversations_per_name`` conversations (smaller
ones are ``unnamed``): one conversation's words never become a name, whatever wrote the label.

The model is plain state: no tasks, no I/O, no locks (every method runs to completion on the event
loop, so a reader sees either the old table or the new one). Metrics are written only by
:meth:`GoalModel.publish`.
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from sidecar.clustering.algorithm import ClusteringResult, assign_nearest
from sidecar.clustering.config import ClusteringConfig
from sidecar.clustering.embed import Matrix
from sidecar.clustering.ids import ClusterIdRegistry
from sidecar.clustering.metrics import ClusteringMetrics
from sidecar.clustering.records import FleetGoalModel, ModelCluster

OTHER = "other"
UNKNOWN = "unknown"
UNNAMED = "unnamed"
_SLUG = re.compile(r"[^a-z0-9 /&+-]+")


def metric_label(text: str, max_chars: int) -> str:
    """A label value safe for Prometheus: lower case, a small alphabet, bounded length."""
    slug = " ".join(_SLUG.sub(" ", text.lower()).split())[:max_chars].strip()
    return slug if slug and slug not in (OTHER, UNKNOWN) else UNNAMED


@dataclass(slots=True)
class ClusterInfo:
    """One live cluster. ``goal`` is its value on metrics (its id, or ``other`` past the top N);
    ``label`` and ``name`` are None/``unnamed`` while it is too small to be named."""

    id: str
    label: str | None
    goal: str
    name: str
    size: int
    assigned_since: int = 0

    def as_json(self, complete: int, incomplete: int) -> dict[str, Any]:
        """The cluster as ``GET /clusters`` shows it, with its completion counts."""
        judged = complete + incomplete
        return {
            "id": self.id,
            "goal": self.goal,
            "name": self.name,
            "label": self.label,
            "size": self.size,
            "assigned_since_clustering": self.assigned_since,
            "complete": complete,
            "incomplete": incomplete,
            "completion_rate": (complete / judged) if judged else None,
        }


class GoalModel:
    """The live clusters, largest first; empty until the first :meth:`apply`."""

    def __init__(self, config: ClusteringConfig, ids: ClusterIdRegistry | None = None) -> None:
        self._cfg = config
        # A random per-process prefix: ids recorded in the results topic before a restart (or by
        # another replica) can never be mistaken for a different cluster of this process.
        self._ids = ids if ids is not None else ClusterIdRegistry(prefix=f"{secrets.token_hex(3)}-g")
        self._clusters: dict[str, ClusterInfo] = {}
        self._order: list[str] = []
        self._centroids: Matrix = np.zeros((0, 0), dtype=np.float32)

    def __len__(self) -> int:
        return len(self._order)

    def __contains__(self, cluster_id: object) -> bool:
        return cluster_id in self._clusters

    def clusters(self) -> list[ClusterInfo]:
        """The live clusters, largest first (as of the last re-clustering)."""
        return [self._clusters[c] for c in self._order]

    def goal_of(self, cluster_id: str | None) -> str:
        """The goal value on metrics: the cluster's id, ``other`` past the top N, else ``unknown``."""
        if cluster_id is None or cluster_id not in self._clusters:
            return UNKNOWN
        return self._clusters[cluster_id].goal

    def nearest(self, vector: Matrix) -> tuple[str, float] | None:
        """The cluster whose centroid is nearest to ``vector`` (a unit embedding) and the distance
        to it, counted as an assignment since the last re-clustering; None before the first."""
        if not self._order:
            return None
        idx, dist = assign_nearest(vector[None, :], self._centroids)
        cid = self._order[int(idx[0])]
        self._clusters[cid].assigned_since += 1
        return cid, float(dist[0])

    def apply(self, result: ClusteringResult) -> list[str]:
        """Make ``result`` the live clusters; returns the id of each of its clusters (by row).

        Ids are matched to the clusters being replaced; old ids left unmatched are retired for
        good. The table is replaced in one step."""
        ids = self._ids.match(self._live_centroids(), result.centroids, self._cfg.id_match_min_similarity)
        rows = zip(ids, result.labels, result.sizes, result.centroids, strict=True)
        self._replace([(cid, label, size) for cid, label, size, _ in rows], result.centroids)
        return ids

    def plan(self, result: ClusteringResult) -> FleetGoalModel:
        """What :meth:`apply` would make of ``result``, as a fleet model row (generation and version
        0, for the caller to set), without changing anything here: the leader publishes it and
        applies it with every other replica when it reads it back (:meth:`load`)."""
        ids = ClusterIdRegistry(self._ids.next_number, self._ids.prefix)
        matched = ids.match(self._live_centroids(), result.centroids, self._cfg.id_match_min_similarity)
        clusters = tuple(
            ModelCluster(cid, label, size, np.asarray(result.centroids[row], dtype=np.float32))
            for row, (cid, label, size) in enumerate(zip(matched, result.labels, result.sizes, strict=True))
        )
        return FleetGoalModel(0, 0, ids.prefix, ids.next_number, clusters)

    def load(self, model: FleetGoalModel) -> list[str]:
        """Make the fleet's ``model`` the live clusters (ids as the leader gave them); returns them."""
        if model.clusters:
            centroids = np.stack([c.centroid for c in model.clusters]).astype(np.float32)
        else:
            centroids = np.zeros((0, 0), dtype=np.float32)
        self._ids.prefix, self._ids.next_number = model.prefix, model.next_number
        self._replace([(c.id, c.label or "", c.size) for c in model.clusters], centroids)
        return [c.id for c in model.clusters]

    def centroids(self) -> Matrix:
        """The live centroids, one row per cluster, largest cluster first."""
        return self._centroids

    def _live_centroids(self) -> dict[str, npt.NDArray[np.float32]]:
        return {cid: self._centroids[i] for i, cid in enumerate(self._order)}

    def _replace(self, rows: list[tuple[str, str, int]], centroids: Matrix) -> None:
        cfg = self._cfg
        clusters: dict[str, ClusterInfo] = {}
        for c, (cid, label, size) in enumerate(rows):  # in decreasing size order
            named = size >= cfg.min_conversations_per_name and bool(label)
            clusters[cid] = ClusterInfo(
                cid,
                label if named else None,
                cid if c < cfg.top_n_labels else OTHER,
                metric_label(label, cfg.max_label_chars) if named else UNNAMED,
                size,
            )
        self._clusters, self._order, self._centroids = clusters, [cid for cid, _, _ in rows], centroids

    def publish(self, metrics: ClusteringMetrics) -> None:
        """Set the cluster count, the sizes per goal value and the id -> name info series."""
        metrics.clusters.set(len(self._order))
        metrics.cluster_size.clear()
        metrics.goal_info.clear()
        for info in self._clusters.values():
            metrics.cluster_size.labels(info.goal).inc(info.size)
            if info.goal != OTHER:
                metrics.goal_info.labels(info.goal, info.name).set(1)
