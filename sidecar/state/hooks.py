"""Hook sets the stream itself provides: a no-op recorder and a fan-out over named hook sets.

The contract they implement (:class:`~sidecar.contract.ConversationHooks`, what a hook sees and
returns, and the guarantees) is in :mod:`sidecar.contract`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence

from sidecar.contract import ConversationHooks, HookResult, Outcome, Scored, TurnContext, events_of


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
