"""The per-turn hook contract that scorers attach to.

The processor calls a hook synchronously. The hook returns either the outcome itself (a
mapping: the decision was immediate, e.g. the turn was sampled out) or an awaitable of it, which
the processor tracks as a pending effect. Either way the partition's committed position never
passes the record that triggered the call until its outcome is recorded in the results topic. This is what makes
effects exactly-once across ``kill -9``: an effect either completed and was recorded (and is then
never fired again), or it was still pending, the commit did not cover it, and it fires again after
the restart.

Hooks therefore must:

* return quickly: long work (an LLM call) happens inside the returned awaitable, not before;
* be safe to run again for the same key after a crash (the awaitable may have been started and
  lost before its outcome was recorded);
* return a small JSON-serialisable mapping (the outcome recorded in the results topic) and never
  put message text into it unless the deployment allows it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from sidecar.events import SpanRef
from sidecar.stage.events import Scored, events_of
from sidecar.transcript.model import Message

HookKind = Literal["user_message", "turn_closed", "conversation_ended"]
HOOK_KINDS: tuple[HookKind, ...] = ("user_message", "turn_closed", "conversation_ended")

EndReason = Literal["end_event", "idle_ttl", "max_lifetime", "evicted", "shutdown"]
CloseReason = Literal["next_user_message", "idle_debounce", "conversation_end"]

Outcome = Mapping[str, Any]
HookResult = Outcome | Awaitable[Outcome]


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


class RecordingHooks:
    """A no-op hook set: every call completes at once with a tiny outcome.

    The outcome is what the results topic records; the kill test compares it with ground truth.
    """

    def __init__(self) -> None:
        self.calls = 0

    def _record(self, ctx: TurnContext) -> Outcome:
        self.calls += 1
        return {"recorded": True, "messages": len(ctx.messages)}

    def on_user_message(self, ctx: TurnContext) -> HookResult:
        return self._record(ctx)

    def on_turn_closed(self, ctx: TurnContext) -> HookResult:
        return self._record(ctx)

    def on_conversation_ended(self, ctx: TurnContext) -> HookResult:
        return self._record(ctx)


def _merge(named: Sequence[tuple[str, Outcome]]) -> Outcome:
    """Members' outcomes under their names, and all their typed events together."""
    return Scored({name: dict(o) for name, o in named}, [e for _, o in named for e in events_of(o)])


class CompositeHooks:
    """Fans one hook call out to several hook sets and merges their outcomes by name.

    Stays synchronous when every member answers synchronously; otherwise awaits the members
    concurrently.
    """

    def __init__(self, named: Mapping[str, ConversationHooks]) -> None:
        self._named = dict(named)

    def _fan_out(self, results: Sequence[tuple[str, HookResult]]) -> HookResult:
        sync = {name: r for name, r in results if isinstance(r, Mapping)}
        if len(sync) == len(results):
            return _merge(list(sync.items()))
        return self._gather(results)

    async def _gather(self, results: Sequence[tuple[str, HookResult]]) -> Outcome:
        async def one(r: HookResult) -> Outcome:
            return r if isinstance(r, Mapping) else await r

        values = await asyncio.gather(*(one(r) for _, r in results))
        return _merge([(name, v) for (name, _), v in zip(results, values, strict=True)])

    def on_user_message(self, ctx: TurnContext) -> HookResult:
        return self._fan_out([(n, h.on_user_message(ctx)) for n, h in self._named.items()])

    def on_turn_closed(self, ctx: TurnContext) -> HookResult:
        return self._fan_out([(n, h.on_turn_closed(ctx)) for n, h in self._named.items()])

    def on_conversation_ended(self, ctx: TurnContext) -> HookResult:
        return self._fan_out([(n, h.on_conversation_ended(ctx)) for n, h in self._named.items()])
