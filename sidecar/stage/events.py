"""Typed outcome events: what scorers found, as data the post-score stage routes to its sinks.

A hook's outcome stays a small JSON mapping (the record the results topic keeps); a hook that has
something typed to say returns a :class:`Scored` mapping, which carries the events besides the
JSON. :class:`~sidecar.state.hooks.CompositeHooks` merges members' events, so one effect (one
hook call of one conversation) reaches the stage with everything every scorer found.

Events carry numbers and ids, and the model's own text where a scorer has it (the most probable
branch of a tree, the remaining tasks). Events never leave the process as such: each sink decides
from its own configuration whether any text goes out (alerts: ``alerting.include_text``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from sidecar.state.hooks import TurnContext

Scorer = Literal["tree", "completion", "final", "goal", "judge"]


@dataclass(frozen=True, slots=True)
class TreeBranch:
    """One root-to-leaf path of a tree: its own text after the split from ``parent`` (at
    ``split_text_chars`` characters into the parent's text), and its path logprob."""

    parent: int | None
    split_text_chars: int
    text: str
    logprob: float
    complete: bool
    truncated: str | None


@dataclass(frozen=True, slots=True)
class TreeScored:
    """A response tree for the turn a user message opened (paper Section 4.3)."""

    leaves: int
    complete_leaves: int
    max_logprob: float | None
    mean_token_logprob: float | None
    generated_tokens: int
    budget_hit: str | None
    model: str
    best_branch: str | None = None
    branches: tuple[TreeBranch, ...] = ()


@dataclass(frozen=True, slots=True)
class CompletionScored:
    """P(end | c_k) and the greedy verdict for a closed turn, or the final one (``final``)."""

    p_end: float
    complete: bool
    variant: str
    model: str
    final: bool = False
    remaining_tasks: str | None = None


@dataclass(frozen=True, slots=True)
class GoalAssigned:
    """The conversation's goal as metrics see it: a stable cluster id, ``other`` or ``unknown``
    (names are published separately)."""

    goal: str


@dataclass(frozen=True, slots=True)
class ScoreSkipped:
    scorer: Scorer
    reason: str


@dataclass(frozen=True, slots=True)
class ScoreFailed:
    scorer: Scorer
    reason: str


OutcomeEvent = TreeScored | CompletionScored | GoalAssigned | ScoreSkipped | ScoreFailed


class Scored(dict[str, Any]):
    """A hook outcome (the JSON mapping journaled in the results topic) with typed events attached.

    Behaves as the plain mapping everywhere an outcome is expected; ``events`` is for the stage.
    """

    __slots__ = ("events",)

    def __init__(self, data: Mapping[str, Any], events: Iterable[OutcomeEvent] = ()) -> None:
        super().__init__(data)
        self.events: tuple[OutcomeEvent, ...] = tuple(events)


def events_of(outcome: Mapping[str, Any]) -> tuple[OutcomeEvent, ...]:
    """The typed events an outcome carries (none for a plain mapping)."""
    return outcome.events if isinstance(outcome, Scored) else ()


@dataclass(slots=True)
class Effect:
    """One hook call's result on its way out: the context, the typed events, the JSON outcome."""

    ctx: TurnContext
    events: tuple[OutcomeEvent, ...]
    outcome: Mapping[str, Any]

    def first(self, kind: type[Any]) -> Any:
        """The first event of type ``kind``, or None."""
        for e in self.events:
            if isinstance(e, kind):
                return e
        return None
