"""The hook contract: what the stream hands a hook, what a hook gives back, and what the post-score
stage routes to its sinks. Every other module imports these types from here, and this module
imports nothing of the sidecar but the transcript model and the event types, so imports go one way.

The processor calls a hook synchronously. The hook returns either the outcome itself (a
mapping: the decision was immediate, e.g. the turn was sampled out) or an awaitable of it, which
the processor tracks as a pending effect. Either way the partition's committed position never
passes the record that triggered the call until its outcome is recorded in the results topic. This
is what makes effects exactly-once across ``kill -9``: an effect either completed and was recorded
(and is then never fired again), or it was still pending, the commit did not cover it, and it fires
again after the restart.

Hooks therefore must:

* return quickly: long work (an LLM call) happens inside the returned awaitable, not before;
* be safe to run again for the same key after a crash (the awaitable may have been started and
  lost before its outcome was recorded);
* return a small JSON-serialisable mapping (the outcome recorded in the results topic) and never
  put message text into it unless the deployment allows it.

A hook's outcome stays that small JSON mapping; a hook that has something typed to say returns a
:class:`Scored` mapping, which carries typed events (what scorers found) besides the JSON.
:class:`~sidecar.state.hooks.CompositeHooks` merges members' events, so one effect (one hook call of
one conversation) reaches the stage with everything every scorer found.

Events carry numbers and ids, and the model's own text where a scorer has it (the most probable
branch of a tree, the remaining tasks). Events never leave the process as such: each sink decides
from its own configuration whether any text goes out (alerts: ``alerting.include_text``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, TypeAlias

from sidecar.events import SpanRef
from sidecar.transcript.model import Message

HookKind = Literal["user_message", "turn_closed", "conversation_ended"]
HOOK_KINDS: tuple[HookKind, ...] = ("user_message", "turn_closed", "conversation_ended")

EndReason = Literal["end_event", "idle_ttl", "max_lifetime", "evicted", "shutdown"]
CloseReason = Literal["next_user_message", "idle_debounce", "conversation_end"]

JsonValue: TypeAlias = "bool | int | float | str | Sequence[JsonValue] | Mapping[str, JsonValue] | None"
Outcome: TypeAlias = Mapping[str, JsonValue]
"""A hook's outcome: a JSON object, recorded as the ``outcome`` of its results record."""
HookResult: TypeAlias = Outcome | Awaitable[Outcome]


@dataclass(frozen=True, slots=True)
class TurnContext:
    """What a hook sees: an immutable snapshot of one conversation at the trigger.

    ``messages`` holds every message received so far (the conversation's prefix up to and
    including the triggering one). ``turn`` is the 1-based turn the hook is about: for
    ``user_message`` the turn that message opens, for ``turn_closed`` the turn that closed, for
    ``conversation_ended`` the last turn (0 if the user never spoke). ``triggered_at_unix`` is the
    wall-clock time (seconds since the epoch) at which the trigger was seen: when the record was
    fetched from Kafka, or when a timer fired. Latency metrics that span processes (user message to
    alert) start from it. ``span`` is the OpenTelemetry span of the last message in ``messages``
    that carried one (events derived from traces), else None.
    """

    kind: HookKind
    conversation_id: str
    turn: int
    messages: Sequence[Message]
    agent: str | None
    tenant: str | None
    close_reason: CloseReason | None = None
    end_reason: EndReason | None = None
    triggered_at_unix: float | None = None
    span: SpanRef | None = None

    @property
    def key(self) -> tuple[str, int, HookKind]:
        """The exactly-once key of this hook call."""
        return (self.conversation_id, self.turn, self.kind)


class ConversationHooks(Protocol):
    """What the stream calls per conversation. See the module docstring for the guarantees."""

    def on_user_message(self, ctx: TurnContext) -> HookResult:
        """A user message arrived (turn ``ctx.turn`` opens). The agent is answering right now."""
        ...

    def on_turn_closed(self, ctx: TurnContext) -> HookResult:
        """Turn ``ctx.turn`` is over: next user message, idle debounce, or conversation end."""
        ...

    def on_conversation_ended(self, ctx: TurnContext) -> HookResult:
        """The conversation is final: end event, idle TTL, eviction under the caps, or shutdown."""
        ...


# -- typed outcome events ------------------------------------------------------------------------

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
class Provenance:
    """Who judged: the evaluator (this package) and its version, the base model served, the adapter
    and its version (None when the base model judged), the rule that turned scores into the verdict
    and its threshold (None when the rule has none, e.g. the greedy end-tag rule)."""

    evaluator: str
    evaluator_version: str
    base_model: str
    adapter: str | None
    adapter_version: str | None
    rule: str
    threshold: float | None = None

    def as_dict(self) -> dict[str, str | float | None]:
        """The JSON form the results topic and the results-out sinks carry."""
        return {
            "evaluator": self.evaluator,
            "evaluator_version": self.evaluator_version,
            "base_model": self.base_model,
            "adapter": self.adapter,
            "adapter_version": self.adapter_version,
            "rule": self.rule,
            "threshold": self.threshold,
        }


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
    provenance: Provenance | None = None


@dataclass(frozen=True, slots=True)
class CompletionScored:
    """P(end | c_k) and the greedy verdict for a closed turn, or the final one (``final``)."""

    p_end: float
    complete: bool
    variant: str
    model: str
    final: bool = False
    remaining_tasks: str | None = None
    provenance: Provenance | None = None


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


def provenance_of(events: Iterable[OutcomeEvent]) -> Provenance | None:
    """The provenance of the first verdict among ``events`` that carries one."""
    for e in events:
        if isinstance(e, TreeScored | CompletionScored) and e.provenance is not None:
            return e.provenance
    return None


def events_of(outcome: Outcome) -> tuple[OutcomeEvent, ...]:
    """The typed events an outcome carries (none for a plain mapping)."""
    return outcome.events if isinstance(outcome, Scored) else ()


@dataclass(slots=True)
class Effect:
    """One hook call's result on its way out: the context, the typed events, the JSON outcome."""

    ctx: TurnContext
    events: tuple[OutcomeEvent, ...]
    outcome: Outcome

    def first(self, kind: type[Any]) -> Any:
        """The first event of type ``kind``, or None."""
        for e in self.events:
            if isinstance(e, kind):
                return e
        return None
