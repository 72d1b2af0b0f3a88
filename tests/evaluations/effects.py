"""Effects as the scorers would hand them to the stage (no vLLM): fakes of scorer outcomes."""

from __future__ import annotations

from sidecar.contract import (
    CompletionScored,
    Effect,
    GoalAssigned,
    HookKind,
    OutcomeEvent,
    ScoreFailed,
    TreeScored,
    TurnContext,
)
from sidecar.events import SpanRef
from sidecar.transcript.model import Message

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
SPAN = "00f067aa0ba902b7"


def tree(leaves: int = 3, max_logprob: float | None = -0.7) -> TreeScored:
    return TreeScored(
        leaves=leaves,
        complete_leaves=leaves,
        max_logprob=max_logprob,
        mean_token_logprob=-0.2,
        generated_tokens=40,
        budget_hit=None,
        model="agent-lora",
        best_branch="sure, booked",
    )


def completion(
    p_end: float = 0.2, *, final: bool = False, remaining: str | None = "pay the deposit"
) -> CompletionScored:
    return CompletionScored(
        p_end=p_end, complete=p_end >= 0.5, variant="lora", model="agent-lora", final=final, remaining_tasks=remaining
    )


def effect(
    kind: HookKind,
    events: tuple[OutcomeEvent, ...],
    *,
    cid: str = "conv-1",
    turn: int = 1,
    span: SpanRef | None = None,
    agent: str | None = "booking",
) -> Effect:
    ctx = TurnContext(
        kind, cid, turn, (Message("user", "book a table"),), agent, None, triggered_at_unix=1_700_000_000.0, span=span
    )
    return Effect(ctx, events, {})


def all_kinds(cid: str = "conv-1", span: SpanRef | None = None) -> list[Effect]:
    """One conversation's verdicts: a tree, a turn's completion, the final verdict with its goal."""
    return [
        effect("user_message", (tree(),), cid=cid, span=span),
        effect("turn_closed", (completion(),), cid=cid, span=span),
        effect(
            "conversation_ended",
            (completion(0.9, final=True), GoalAssigned("g3"), ScoreFailed("tree", "x")),
            cid=cid,
            span=span,
        ),
    ]
