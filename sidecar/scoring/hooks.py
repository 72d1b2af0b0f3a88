"""``ScoringHooks``: the live scoring policy on the stream's per-turn hooks.

The scorers themselves (tokenizer, prompts, completion scorers, tree expander, adapter trust) are a
:class:`~sidecar.scoring.scorers.Scorers`, which offline tools use directly; this module decides
what to score, when, and what a failure becomes.

* ``on_user_message`` -> response tree for the conversation up to that user message plus an empty
  assistant prefix, computed while the agent itself is still answering (escalation in time).
* ``on_turn_closed`` -> completion score of c_k (the turn that closed).
* ``on_conversation_ended`` -> the final completion verdict and
  ``sidecar_conversations_ended_total{agent,outcome,goal}``; a verdict already computed for the
  same prefix (the last turn closed just before the end) is reused, not recomputed. Final verdicts
  also feed the agent's drift window (:mod:`~sidecar.scoring.drift`).

Every hook returns at once: the outcome itself when no model call is needed (disabled, sampled out,
token budget spent), else a coroutine the processor tracks as a pending effect. Inside it,
vLLM outages and saturation make it *wait* (bounded concurrency in the client, its retry layer and
breaker, then :func:`~sidecar.scoring.schedule.until_available`): that is how backpressure reaches
Kafka. Permanent failures (a 4xx such as prompt too long, unsafe content) give ``{"error":
reason}`` and a counter. Cancellation propagates. Outcomes carry numbers only, unless the config
allows text.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from typing import Any, TypeVar

import structlog
from prometheus_client import CollectorRegistry

from sidecar.contract import CompletionScored, HookResult, Outcome, Provenance, Scored, TurnContext
from sidecar.errors import PermanentError
from sidecar.lifecycle import Health
from sidecar.provenance import EVALUATOR_NAME, evaluator_version
from sidecar.scoring.client import LLMClient
from sidecar.scoring.completion import CompletionScore, with_threshold
from sidecar.scoring.config import AgentConfig, ScoringConfig
from sidecar.scoring.drift import DriftTracker
from sidecar.scoring.gate import GateDecision, TreeGate, probe_signal
from sidecar.scoring.metrics import ScoringMetrics
from sidecar.scoring.prompts import PromptTooLong
from sidecar.scoring.routes import LiveRoutes
from sidecar.scoring.schedule import LruCache, Slots, TokenBucket, sampled, until_available
from sidecar.scoring.scorers import Scorers, TreeRequest, failure_reason
from sidecar.scoring.tree import ResponseTree
from sidecar.scoring.trust import AdapterTrust
from sidecar.telemetry.labels import AgentLabels
from sidecar.transcript.model import Message, prefix_through_turn
from sidecar.transcript.tokenize import SafeTokenizer, UnsafeContentError

log = structlog.get_logger()

T = TypeVar("T")
GoalLabeler = Callable[[TurnContext], Awaitable[str]]
_CACHE_SIZE = 4096
_LATEST_TURNS = 65536  # conversations whose newest user turn is remembered for the tree debounce


async def _unknown_goal(_ctx: TurnContext) -> str:
    return "unknown"


class ScoringHooks:
    """Implements :class:`~sidecar.state.hooks.ConversationHooks` with vLLM-backed scorers.

    The live policy around a :class:`~sidecar.scoring.scorers.Scorers`: what to score (sampling,
    per-agent token budgets, the tree debounce and staleness), how long to wait (bounded slots per
    kind, waiting out outages) and what a failure becomes (``{"error": reason}`` and a counter).
    It owns the scorers it is given: :meth:`start`, :meth:`stop` and :meth:`health` are theirs.
    """

    def __init__(
        self,
        scorers: Scorers,
        metrics: ScoringMetrics,
        *,
        goal_labeler: GoalLabeler | None = None,
        agent_labels: AgentLabels | None = None,
        drift: DriftTracker | None = None,
    ) -> None:
        self.scorers = scorers
        self.config = scorers.config
        self.metrics = metrics
        self._labels = agent_labels or AgentLabels(self.config.agents)
        self.trust.publish_configured(self._labels)
        self._goal = goal_labeler or _unknown_goal
        self.drift = drift
        self.routes: LiveRoutes | None = None
        self._budgets: dict[str, TokenBucket] = {}
        self._slots: dict[str, Slots] = {}
        self._latest_turn: LruCache[str, int] = LruCache(_LATEST_TURNS)
        self._verdicts: LruCache[tuple[str, int, str], CompletionScore] = LruCache(_CACHE_SIZE)
        self.gate = TreeGate(self.config.tree.gate)

    @classmethod
    def from_config(
        cls,
        config: ScoringConfig,
        registry: CollectorRegistry,
        *,
        client: LLMClient | None = None,
        tokenizer: SafeTokenizer | None = None,
        goal_labeler: GoalLabeler | None = None,
        agent_labels: AgentLabels | None = None,
    ) -> ScoringHooks:
        """The live hooks for ``config``: its metrics on ``registry``, scorers on ``client`` (used as
        given) or on a :class:`~sidecar.scoring.client.VllmClient` they own, the trusted gauge wired, final
        verdicts tracked for drift (:mod:`~sidecar.scoring.drift`)."""
        metrics = ScoringMetrics(registry)

        def gauge(label: str, value: float) -> None:
            metrics.adapter_trusted.labels(label).set(value)

        if client is None:
            scorers = Scorers.from_config(config, registry, tokenizer=tokenizer, trust_gauge=gauge)
        else:
            scorers = Scorers(config, client, tokenizer=tokenizer, trust_gauge=gauge)
        drift = DriftTracker(config.drift, registry)
        return cls(scorers, metrics, goal_labeler=goal_labeler, agent_labels=agent_labels, drift=drift)

    @property
    def trust(self) -> AdapterTrust:
        """The scorers' adapter trust (a health reporter of its own)."""
        return self.scorers.trust

    def follow(self, routes: LiveRoutes) -> None:
        """Score with ``routes`` (live rows over ``scoring.agents``) from now on."""
        self.routes = routes
        routes.listen(self._route_changed, self._route_revalidated)

    def settings(self, agent: str | None) -> AgentConfig:
        """The agent's settings: its live route over the configured ones."""
        return self.routes.agent(agent) if self.routes is not None else self.config.agent(agent)

    def _route_changed(self, agent: str, settings: AgentConfig | None) -> None:
        self.trust.reassess(agent, settings, self.config.agent(agent))
        label = self._agent_label(agent)
        self.trust.publish(label, self.trust.route(agent))  # every replica shows it, scoring the agent or not
        if self.drift is not None:
            self.drift.reset(label)

    def _route_revalidated(self, agent: str, settings: AgentConfig) -> None:
        """The same route with a fresh validation F1: trust follows it, the drift window goes on."""
        self.trust.reassess(agent, settings, self.config.agent(agent))
        self.trust.publish(self._agent_label(agent), self.trust.route(agent))

    # -- lifecycle --------------------------------------------------------------------------------

    async def start(self) -> None:
        await self.scorers.start()

    async def stop(self) -> None:
        await self.scorers.stop()

    def health(self) -> Health:
        return self.scorers.health()

    # -- helpers ----------------------------------------------------------------------------------

    def _agent_label(self, agent: str | None) -> str:
        return self._labels(agent)

    def _budget(self, label: str, cfg: AgentConfig) -> TokenBucket:
        bucket = self._budgets.get(label)
        if bucket is None:
            bucket = self._budgets[label] = TokenBucket(cfg.max_tokens_per_minute)
        return bucket

    def _messages(self, ctx: TurnContext) -> Sequence[Message]:
        # c_k: turns 0..k only. A turn closed by the next user message has that message in the
        # snapshot already, and it is not part of the turn being judged. (Messages are redacted on
        # arrival, when redaction is on: see state.redaction.)
        return prefix_through_turn(ctx.messages, ctx.turn)

    def _wait(self, kind: str) -> Callable[[], None]:
        return lambda: self.metrics.backpressure_waits.labels(kind).inc()

    async def _until_available(self, kind: str, call: Callable[[], Awaitable[T]]) -> T:
        v = self.config.vllm
        return await until_available(
            call,
            on_wait=self._wait(kind),
            initial_seconds=v.retry_initial_backoff_seconds,
            cap_seconds=v.outage_poll_max_seconds,
        )

    async def _guard(self, kind: str, label: str, work: Callable[[], Awaitable[Outcome]]) -> Outcome:
        t0 = time.monotonic()
        slots = self._slots.get(kind)
        if slots is None:
            # Trees newest first (a tree is only useful while the agent is still answering).
            slots = self._slots[kind] = Slots(self.config.scheduling.max_pending_per_kind, lifo=kind == "tree")
        try:
            # Per kind, so a burst of trees cannot starve completion verdicts of vLLM slots.
            async with slots:
                return await work()
        except (PromptTooLong, UnsafeContentError, PermanentError) as exc:
            reason = failure_reason(exc)
            self.metrics.errors.labels(label, kind, reason).inc()
            log.warning("score.failed", kind=kind, agent=label, reason=reason)
            return {"error": reason}
        finally:
            self.metrics.latency.labels(label, kind).observe(time.monotonic() - t0)

    def _skip(self, kind: str, label: str, reason: str) -> Outcome:
        self.metrics.skipped.labels(label, kind, reason).inc()
        return {"skipped": reason}

    # -- completion -------------------------------------------------------------------------------

    async def _completion(self, ctx: TurnContext, label: str) -> CompletionScore:
        """c_k's verdict under the agent's rule (the raw greedy score is what is cached)."""
        cfg = self.settings(ctx.agent)
        route = self.trust.route(ctx.agent)
        self.trust.publish(label, route)
        messages = self._messages(ctx)
        key = (ctx.conversation_id, len(messages), cfg.adapter or "")
        score = self._verdicts.get(key)
        if score is None:
            request = await self.scorers.completion_request(messages, cfg.adapter)
            score = await self._until_available("completion", request.score)
            self._budget(label, cfg).spend(score.generated_tokens)
            self.metrics.p_end.labels(label).observe(score.p_end)
            self.metrics.completion_requests.labels(label).observe(score.requests)
            self._verdicts.put(key, score)
        if route.p_end_threshold is not None and score.variant == "adapter":
            return with_threshold(score, route.p_end_threshold)
        return score

    def _outcome(self, ctx: TurnContext, score: CompletionScore) -> dict[str, Any]:
        include = self.config.completion.include_text_in_outcome
        return {**score.outcome(include_text=include), **self.trust.route(ctx.agent).outcome()}

    def on_turn_closed(self, ctx: TurnContext) -> HookResult:
        label = self._agent_label(ctx.agent)
        cfg = self.settings(ctx.agent)
        # Decisions that need no model are returned at once (the processor records them directly).
        if not (self.config.enabled and self.config.completion.enabled):
            return self._skip("completion", label, "disabled")
        if not sampled(cfg.completion_sample_rate, ctx.conversation_id, ctx.turn, "completion"):
            return self._skip("completion", label, "sampled_out")
        if not self._budget(label, cfg).available():
            return self._skip("completion", label, "token_budget")

        async def work() -> Outcome:
            score = await self._completion(ctx, label)
            self.metrics.turns_scored.labels(label, "complete" if score.complete else "incomplete").inc()
            return Scored(self._outcome(ctx, score), [self._completion_event(ctx, score, final=False)])

        return self._guard("completion", label, work)

    def on_conversation_ended(self, ctx: TurnContext) -> HookResult:
        label = self._agent_label(ctx.agent)
        scoring = self.config.enabled and self.config.completion.enabled and ctx.turn > 0

        async def work() -> Outcome:
            goal = await self._goal_of(ctx)
            if not scoring:
                self.metrics.conversations_ended.labels(label, "unscored", goal).inc()
                return {**self._skip("final", label, "disabled" if ctx.turn else "no_user_turn"), "goal": goal}
            try:
                score = await self._completion(ctx, label)
            except (PromptTooLong, UnsafeContentError, PermanentError):
                self.metrics.conversations_ended.labels(label, "error", goal).inc()
                raise
            outcome = "complete" if score.complete else "incomplete"
            self.metrics.conversations_ended.labels(label, outcome, goal).inc()
            if self.drift is not None:
                untrusted = not self.trust.route(ctx.agent).trusted
                cfg = self.settings(ctx.agent)
                self.drift.observe(label, cfg, p_end=score.p_end, complete=score.complete, untrusted=untrusted)
            return Scored(
                {**self._outcome(ctx, score), "final": True, "goal": goal},
                [self._completion_event(ctx, score, final=True)],
            )

        return self._guard("final", label, work)

    def _completion_event(self, ctx: TurnContext, score: CompletionScore, *, final: bool) -> CompletionScored:
        # Events stay in the process (sinks decide what text, if any, leaves it).
        adapter = self.settings(ctx.agent).adapter
        used = adapter if score.variant == "adapter" and adapter else None
        # with_threshold() keeps the greedy verdict aside when the threshold rule decided.
        threshold = self.trust.route(ctx.agent).p_end_threshold if score.greedy_complete is not None else None
        return CompletionScored(
            p_end=score.p_end,
            complete=score.complete,
            variant=score.variant,
            model=used or self.config.vllm.base_model,
            final=final,
            remaining_tasks=None if score.complete else score.remaining_text,
            provenance=self._provenance(ctx.agent, used, "threshold" if threshold is not None else "greedy", threshold),
        )

    def _provenance(self, agent: str | None, adapter: str | None, rule: str, threshold: float | None) -> Provenance:
        """Who judged: this evaluator, the base model, ``adapter`` (the agent's, when it is the one that
        judged: its live route's version, else its manifest's) and the rule with its threshold."""
        version = None
        if adapter is not None and adapter == self.settings(agent).adapter:
            row = self.routes.row(agent) if self.routes is not None and agent is not None else None
            version = f"route-{row.version}" if row is not None else self.trust.route(agent).adapter_version
        return Provenance(
            evaluator=EVALUATOR_NAME,
            evaluator_version=evaluator_version(),
            base_model=self.config.vllm.base_model,
            adapter=adapter,
            adapter_version=version,
            rule=rule,
            threshold=threshold,
        )

    async def _goal_of(self, ctx: TurnContext) -> str:
        try:
            return await self._goal(ctx)
        except Exception as exc:  # the labeler is another team's code: a bad label is not fatal
            log.warning("score.goal_label_failed", error=type(exc).__name__)
            return "unknown"

    # -- response tree ----------------------------------------------------------------------------

    def on_user_message(self, ctx: TurnContext) -> HookResult:
        label = self._agent_label(ctx.agent)
        cfg = self.settings(ctx.agent)
        tc = self.config.tree
        if not (self.config.enabled and tc.enabled):
            return self._skip("tree", label, "disabled")
        if not sampled(cfg.tree_sample_rate, ctx.conversation_id, ctx.turn, "tree"):
            return self._skip("tree", label, "sampled_out")
        bucket = self._budget(label, cfg)
        if not bucket.available():
            return self._skip("tree", label, "token_budget")
        latest = self._latest_turn.get(ctx.conversation_id)
        if latest is None or latest < ctx.turn:
            self._latest_turn.put(ctx.conversation_id, ctx.turn)

        async def work() -> Outcome:
            # Debounce: a tree still waiting for vLLM when the user has already sent another
            # message is stale (the agent has moved on); only the newest one is worth computing.
            newest = self._latest_turn.get(ctx.conversation_id)
            if tc.skip_superseded and newest is not None and newest > ctx.turn:
                return self._skip("tree", label, "superseded")
            # Shed: by now the agent has long answered; a verdict on it would escalate nothing.
            seen = ctx.triggered_at_unix
            if tc.max_staleness_seconds and seen is not None and time.time() - seen > tc.max_staleness_seconds:
                return self._skip("tree", label, "stale")
            request = await self.scorers.tree_request(self._messages(ctx), self.scorers.tree_model(ctx.agent))
            tree, decision = await self._gated_tree(request, label)
            bucket.spend(tree.generated_tokens)
            stats = tree.stats()
            if decision is not None:
                stats["gate"] = decision.decision
            best = stats["max_logprob"]
            self.metrics.tree_leaves.labels(label).observe(tree.leaves)
            self.metrics.tree_tokens.labels(label).observe(tree.generated_tokens)
            if best is not None:
                self.metrics.tree_max_logprob.labels(label).observe(best)
            if tree.budget_hit:
                self.metrics.tree_budget_hits.labels(label, tree.budget_hit).inc()
            text = self.scorers.best_branch_text(tree)
            out: dict[str, Any] = {**stats, "turns_dropped": request.turns_dropped}
            if tc.include_text_in_outcome:
                out["best_branch"] = text
            event = self.scorers.tree_scored(tree, request.model, text)
            adapter = None if request.model == self.config.vllm.base_model else request.model
            provenance = self._provenance(ctx.agent, adapter, "response_tree", tc.alpha)
            return Scored(out, [replace(event, provenance=provenance)])

        return self._guard("tree", label, work)

    async def _gated_tree(self, request: TreeRequest, label: str) -> tuple[ResponseTree, GateDecision | None]:
        """The tree, through the gate when it is on (its decision too: None when off)."""
        if not self.gate.enabled:
            return await self._until_available("tree", request.expand), None
        decided: list[GateDecision] = []

        def grow(probed: ResponseTree) -> bool:
            # A retry after an outage probes again: the decision of the attempt that finished counts.
            decided.append(self.gate.decide(label, probe_signal(probed)))
            return decided[-1].grow

        probe = self.config.tree.gate.probe_tokens
        tree = await self._until_available("tree", lambda: request.expand(probe_tokens=probe, grow=grow))
        self.metrics.tree_gate.labels(label, decided[-1].decision).inc()
        return tree, decided[-1]
