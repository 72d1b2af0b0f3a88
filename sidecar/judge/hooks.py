"""``JudgeHooks``: the two-dimensional judge as an optional live scorer on sampled ended conversations.

Implements :class:`~sidecar.state.hooks.ConversationHooks`. Only ``on_conversation_ended`` does
work; the per-turn hooks answer ``{}`` at once (the judge looks at whole conversations, as the
comparison baseline does offline).

Every decision that needs no model is returned at once, as the scorers do: judging disabled
(``judge.enabled`` false), no user turn, sampled out (a hash of the conversation id, so a replay
after a crash decides the same), the call or token budget of the last minute spent. Otherwise the
hook returns an awaitable; inside it, more than ``max_pending`` conversations already being
judged gives ``overloaded`` instead of queueing: the judge is a baseline, and it must never hold the
stream's commit point back for long. For the same reason an outage of the judge's endpoint is
*not* waited out: after the client's bounded retry layer the outcome records the error.

Outcomes carry the decision, per-dimension counts and the cost; explanations and item texts only
with ``judge.include_text_in_outcome``.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from sidecar.contract import HookResult, Outcome, TurnContext
from sidecar.judge.chat import ChatClient
from sidecar.judge.config import JudgeConfig
from sidecar.judge.judge import TwoDimensionalJudge
from sidecar.judge.metrics import JudgeMetrics
from sidecar.scoring.schedule import TokenBucket, sampled


class JudgeHooks:
    """The judge on the stream's hooks (see the module docstring); a :class:`~sidecar.lifecycle.Component`."""

    def __init__(self, config: JudgeConfig, registry: CollectorRegistry, *, client: ChatClient | None = None) -> None:
        self.config = config
        self.metrics = JudgeMetrics(registry)
        self.judge = TwoDimensionalJudge(config, self.metrics, client)
        self._calls = TokenBucket(config.max_calls_per_minute)
        self._tokens = TokenBucket(config.max_tokens_per_minute)
        self._pending = 0

    async def start(self) -> None:
        """Nothing to start: the client connects on first use."""

    async def stop(self) -> None:
        """Close the judge's client; idempotent."""
        await self.judge.aclose()

    @property
    def pending(self) -> int:
        """Conversations being judged right now."""
        return self._pending

    def _skip(self, reason: str) -> Outcome:
        self.metrics.skipped.labels(reason).inc()
        return {"skipped": reason}

    def on_user_message(self, ctx: TurnContext) -> HookResult:
        del ctx
        return {}

    def on_turn_closed(self, ctx: TurnContext) -> HookResult:
        del ctx
        return {}

    def on_conversation_ended(self, ctx: TurnContext) -> HookResult:
        cfg = self.config
        if not cfg.enabled:
            return self._skip("disabled")
        if ctx.turn == 0:
            return self._skip("no_user_turn")
        if not sampled(cfg.sample_rate, ctx.conversation_id, "judge"):
            return self._skip("sampled_out")
        if not self._calls.available():
            return self._skip("call_budget")
        if not self._tokens.available():
            return self._skip("token_budget")
        return self._judge(ctx)

    async def _judge(self, ctx: TurnContext) -> Outcome:
        # Counted inside the coroutine (no await before it), so an awaitable that is dropped
        # before it starts cannot leak a pending slot.
        if self._pending >= self.config.max_pending:
            return self._skip("overloaded")
        self._pending += 1
        try:
            verdict = await self.judge.judge(ctx.messages)
        finally:
            self._pending -= 1
        self._calls.spend(verdict.calls)
        self._tokens.spend(verdict.prompt_tokens + verdict.completion_tokens)
        return verdict.outcome(include_text=self.config.include_text_in_outcome)
