"""``Leadership``: which replica of the fleet does the jobs that must run once.

The elected owner is the member of the sidecar's own consumer group that is assigned partition 0
of the source topic. Kafka's group coordinator already guarantees that at most one member holds a
partition in a given group generation, hands it over when that member leaves or stops
heartbeating, and gives every assignment a new generation number: no second election protocol,
no lease store. A replica's :class:`Term` is the generation it was given partition 0 in.

Two leaders can still act at once: a member paused past its session timeout (SIGSTOP, a long GC,
a frozen node) keeps believing it leads until its next heartbeat fails, while its successor already
does. Everything an owner writes to shared state therefore carries its term's generation, and
readers never let an older generation replace a newer one (:func:`sidecar.fleet.table.fenced`);
an owner that reads a row of a newer generation than its own knows it was superseded.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Final

import structlog
from prometheus_client import CollectorRegistry, Gauge

from sidecar.lifecycle import Health

log = structlog.get_logger(__name__)

LEADER_PARTITION: Final = 0


@dataclass(frozen=True, slots=True)
class Term:
    """This replica leads for the group generation ``generation`` (as member ``member_id``)."""

    generation: int
    member_id: str


class Leadership:
    """Fed by the source's rebalance callbacks; read by the jobs that must run once."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self._term: Term | None = None
        self._callbacks: list[Callable[[Term | None], None]] = []
        self._superseded_by: int | None = None
        self._leader = Gauge(
            "sidecar_fleet_leader",
            "1 while this replica is the fleet's elected owner (it owns source partition 0).",
            registry=registry,
        )
        self._generation = Gauge(
            "sidecar_fleet_leader_generation",
            "The consumer-group generation of this replica's current term as owner (0 when not leading).",
            registry=registry,
        )

    @property
    def term(self) -> Term | None:
        """The current term, or None when another replica leads (or nothing is assigned yet)."""
        return self._term

    def subscribe(self, callback: Callable[[Term | None], None]) -> None:
        """Call ``callback(term)`` when this replica starts leading, and ``callback(None)`` when it stops."""
        self._callbacks.append(callback)

    def assigned(self, partitions: Collection[int], generation: int, member_id: str) -> None:
        """The source was assigned ``partitions`` in group generation ``generation``."""
        leading = LEADER_PARTITION in partitions and generation >= 0
        term = Term(generation, member_id) if leading else None
        if term != self._term:
            self._set(term)

    def revoked(self) -> None:
        """The source gave its partitions up (a rebalance began): no term until the next assignment."""
        if self._term is not None:
            self._set(None)

    def superseded(self, generation: int) -> None:
        """A row written by an owner of ``generation`` was read: if that is newer than this term,
        this replica was replaced while it did not know (it stops leading until reassigned)."""
        if self._term is not None and generation > self._term.generation:
            log.warning("fleet.leader_superseded", generation=self._term.generation, successor=generation)
            self._superseded_by = generation
            self._set(None)

    def health(self) -> Health:
        """Never gates: it only says who this replica is."""
        if self._term is not None:
            return Health("leadership", True, f"leader generation={self._term.generation}")
        return Health("leadership", True, "follower")

    def _set(self, term: Term | None) -> None:
        self._term = term
        self._leader.set(1 if term is not None else 0)
        self._generation.set(term.generation if term is not None else 0)
        log.info("fleet.leadership", leading=term is not None, generation=term.generation if term else None)
        for callback in list(self._callbacks):
            callback(term)
