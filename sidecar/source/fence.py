"""``MemberFence``: once this member may have lost its partitions, it writes nothing for them.

A consumer-group member learns that it was superseded late, or never: a member whose process was
stopped (a long GC, a frozen node, CPU throttling, SIGSTOP) misses its heartbeats, the group
coordinator hands its partitions to another member after the session timeout, and the next owner
recovers from the commit and the journal. When the stopped process wakes, its fetched records,
timers (which now all look due: an idle timer closes turns the new owner closes otherwise) and
unacknowledged writes would otherwise run on, and write outcomes, fire sinks and commit for
partitions that are no longer its own.

The fence is up from the moment the member *may* have lost them, whichever comes first:

- ``loop_stalled``: the event loop did not run for longer than the member can go without a
  heartbeat (``session_timeout_ms - heartbeat_interval_ms``; the last heartbeat may have been sent
  up to one interval before the stall began). A watchdog task beats every
  :data:`WATCHDOG_INTERVAL_SECONDS`; every check measures the time since the last beat, so the
  first callback that runs after a stall sees it, before anything else of that callback happens.
- ``generation_lost``: the group coordinator no longer holds the generation and member id of the
  assignment (aiokafka resets them on a heartbeat, join or commit answered ``IllegalGeneration`` or
  ``UnknownMemberId``, and starts a new generation on a rejoin).
- ``commit_refused``: an offset commit came back ``CommitFailedError`` for this member.

A ``RebalanceInProgress`` answer alone does not fence: under the eager protocol the new round
cannot complete without this member's JoinGroup, which aiokafka sends only after the revoke
callback has returned, so the member still owns its partitions while it releases them.

Each assignment arms a new epoch; everything of an older epoch stays fenced, so a task that
outlives its epoch cannot act in the next one. Fenced partitions are released without flush or
commit (:meth:`PartitionProcessor.release_fenced`): their pending effects are abandoned, and the
next owner redoes them from the journal.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Literal, Protocol

import structlog

log = structlog.get_logger(__name__)

WATCHDOG_INTERVAL_SECONDS = 0.1

FenceReason = Literal["loop_stalled", "generation_lost", "commit_refused"]
FENCE_REASONS: tuple[FenceReason, ...] = ("loop_stalled", "generation_lost", "commit_refused")


class Fence(Protocol):
    """What a partition processor asks before every effect, write and commit."""

    @property
    def epoch(self) -> int: ...

    def allows(self, epoch: int) -> bool: ...


def _no_term() -> tuple[int, str]:
    return (-1, "")


class MemberFence:
    """Whether this member may still act for the partitions of its current assignment."""

    def __init__(
        self,
        stall_limit_seconds: float,
        *,
        term: Callable[[], tuple[int, str]] = _no_term,
        on_fenced: Callable[[FenceReason], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.stall_limit_seconds = stall_limit_seconds
        self._term_of = term
        self._on_fenced = on_fenced
        self._clock = clock
        self.epoch = 0
        self._term: tuple[int, str] | None = None
        self.reason: FenceReason | None = None
        self._last_beat = clock()
        self._watching = False

    # -- the watchdog ------------------------------------------------------------------------

    def watching(self, on: bool) -> None:
        """The watchdog task starts (True) or stops (False) beating; only while it beats can a
        missing beat mean a stall."""
        self._watching = on
        self._last_beat = self._clock()

    def beat(self) -> None:
        """Called by the watchdog every :data:`WATCHDOG_INTERVAL_SECONDS`."""
        self._check_gap()
        self._last_beat = self._clock()

    def _check_gap(self) -> None:
        if self._watching and self.reason is None and self._term is not None:
            gap = self._clock() - self._last_beat
            if gap > self.stall_limit_seconds:
                self.fence("loop_stalled", gap_seconds=round(gap, 3))

    # -- assignments -------------------------------------------------------------------------

    def arm(self) -> int:
        """A new assignment: a new epoch, owned under the coordinator's current term."""
        self.epoch += 1
        self._term = self._term_of()
        self.reason = None
        self._last_beat = self._clock()
        return self.epoch

    def fence(self, reason: FenceReason, **detail: object) -> None:
        """Stop every effect of the current epoch (idempotent; the first reason is kept)."""
        if self.reason is not None or self._term is None:
            return
        self.reason = reason
        log.warning("kafka.member_fenced", reason=reason, epoch=self.epoch, **detail)
        if self._on_fenced is not None:
            self._on_fenced(reason)

    # -- the check before every effect --------------------------------------------------------

    def allows(self, epoch: int) -> bool:
        """True while ``epoch`` is the current one and nothing says it was superseded."""
        if epoch != self.epoch:
            return False
        if self.reason is None:
            self._check_gap()
            if self.reason is None and self._term is not None and self._term_of() != self._term:
                self.fence("generation_lost")
        return self.reason is None

    @property
    def fenced(self) -> bool:
        """The current epoch is fenced."""
        return not self.allows(self.epoch)


async def watchdog(fence: MemberFence) -> None:
    """Beat the fence's clock: a gap between beats is a stall of the whole event loop."""
    fence.watching(True)
    try:
        while True:
            await asyncio.sleep(WATCHDOG_INTERVAL_SECONDS)
            fence.beat()
    finally:
        fence.watching(False)


def group_term(consumer: object) -> tuple[int, str]:
    """The group generation and member id of the consumer's current assignment.

    aiokafka keeps them on its coordinator only (no public accessor); both are set before the
    assignment callback runs, and reset (-1 / "") when the coordinator answers a heartbeat, join or
    commit with ``IllegalGeneration`` or ``UnknownMemberId``. -1 / "" outside a group."""
    coordinator = getattr(consumer, "_coordinator", None)
    generation = getattr(coordinator, "generation", -1)
    member_id = getattr(coordinator, "member_id", "")
    return int(generation if isinstance(generation, int) else -1), str(member_id or "")


def request_rejoin(consumer: object) -> None:
    """Ask aiokafka's coordinator for a new join round (it revokes everything first): a fenced
    member that the group still counts in would otherwise keep partitions it no longer processes."""
    coordinator = getattr(consumer, "_coordinator", None)
    rejoin = getattr(coordinator, "request_rejoin", None)
    if callable(rejoin):
        rejoin()


class Unfenced:
    """The fence of a processor that no group can supersede (tests, a single owner): never up."""

    @property
    def epoch(self) -> int:
        return 0

    def allows(self, epoch: int) -> bool:  # noqa: ARG002 - every epoch is current
        return True

    @property
    def fenced(self) -> bool:
        return False
