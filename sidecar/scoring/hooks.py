"""``ScoringHooks``: the completion scorer and the response tree on the stream's per-turn hooks.

* ``on_user_message`` -> response tree for the conversation up to that user message plus an empty
  assistant prefix, computed while the agent itself is still answering (escalation in time).
* ``on_turn_closed`` -> completion score of c_k (the turn that closed).
* ``on_conversation_ended`` -> the final completion verdict and
  ``sidecar_conversations_ended_total{agent,outcome,goal}``; a verdict already computed for the
  same prefix (the last turn closed just before the end) is reused, not recomputed.

Every hook returns at once: the outcome itself when no model call is needed (disabled, sampled out,
token budget spent), else a coroutine the processor tracks as a pending effect. Inside it,
vLLM outages and saturation make it *wait* (bounded concurrency in the client, its retry layer and
breaker, then :func:`~sidecar.scoring.schedule.until_available`): that is how backpressure reaches
Kafka. Permanent failures (a 4xx such as prompt too long, unsafe content) give ``{"error":
reason}`` and a counter. Cancellation propagates. Outcomes carry numbers only, unless the config
allows text.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import structlog
from prometheus_client import CollectorRegistry

from sidecar.contract import CompletionScored, HookResult, Outcome, Scored, TreeBranch, TurnContext
from sidecar.errors import ConfigError, PermanentError
from sidecar.lifecycle import Health
from sidecar.scoring.client import LLMClient, VllmClient
from sidecar.scoring.completion import CompletionScore, CompletionScorer, with_threshold
from sidecar.scoring.config import AgentConfig, ScoringConfig
from sidecar.scoring.metrics import ScoringMetrics
from sidecar.scoring.prompts import PromptBuilder, PromptTooLong
from sidecar.scoring.schedule import LruCache, Slots, TokenBucket, sampled, until_available
from sidecar.scoring.tree import TreeBudget, TreeExpander, branch_views, most_probable_text, tree_event
from sidecar.scoring.trust import AdapterTrust
from sidecar.telemetry.labels import AgentLabels
from sidecar.transcript.model import Message, prefix_through_turn
from sidecar.transcript.tokenize import SafeTokenizer, UnsafeContentError

log = structlog.get_logger()

T = TypeVar("T")
GoalLabeler = Callable[[TurnContext], Awaitable[str]]
_CACHE_SIZE = 4096
_LATEST_TURNS = 65536  # conversations whose newest user turn is remembered for the tree debounce
# Tokenisation scales with a conversation's length: they run on these threads, never
# on the event loop (the Kafka heartbeat and every other partition share that loop).
_PROMPT_THREADS = 2


async def _unknown_goal(_ctx: TurnContext) -> str:
    return "unknown"


class ScoringHooks:
    """Implements :class:`~sidecar.state.hooks.ConversationHooks` with vLLM-backed scorers."""

    def __init__(
        self,
        config: ScoringConfig,
        registry: CollectorRegistry,
        *,
        client: LLMClient | None = None,
        tokenizer: SafeTokenizer | None = None,
        goal_labeler: GoalLabeler | None = None,
        agent_labels: AgentLabels | None = None,
    ) -> None:
        self.config = config
        self._labels = agent_labels or AgentLabels(config.agents)
        self.metrics = ScoringMetrics(registry)
        self._owned_client: VllmClient | None = None
        if client is None:
            self._owned_client = VllmClient(config.vllm, registry, max_logprobs=config.max_logprobs)
            client = self._owned_client
        self.client = client
        if tokenizer is None:
            if config.tokenizer.model_dir is None:
                raise ConfigError("scoring.tokenizer.model_dir is required")
            tokenizer = SafeTokenizer.from_model_dir(
                config.tokenizer.model_dir, extra_special=config.tokenizer.special_tokens
            )
        self.tok = tokenizer
        cc = config.completion
        self.prompts = PromptBuilder(
            tokenizer,
            end_tag=cc.end_tag,
            instruct_prompt=cc.instruct_prompt,
            use_chat_template=cc.instruct_use_chat_template,
            max_prompt_tokens=config.max_prompt_tokens,
            tail_truncation=config.prompt_truncation in ("tail", "stride"),
            stride_tokens=config.prompt_stride_tokens if config.prompt_truncation == "stride" else None,
            max_message_tokens=config.max_message_tokens,
            paper_bos=config.tokenizer.paper_format_bos,
            tree_use_chat_template=config.tree.use_chat_template,
        )
        self.end_id = _end_tag_id(tokenizer, cc.end_tag, config)
        pad_ids = {tokenizer.token_id(t) for t in tokenizer.special_strings if "pad" in t.lower()}
        # Any special token ends a response (eos, eot, the end tag), except BOS and padding.
        self.stop_ids = sorted(tokenizer.special_ids - {tokenizer.bos_id} - pad_ids)
        # Without an end-tag token (a stock base model, instruct variant only) no adapter scorer.
        self._adapter_scorer = (
            CompletionScorer(
                client,
                end_ids=[self.end_id],
                stop_token_ids=self.stop_ids,
                max_remaining_tokens=cc.max_remaining_tokens,
                decode=tokenizer.decode,
            )
            if self.end_id is not None
            else None
        )
        marker = tokenizer.encode_trusted(cc.instruct_end_marker)
        self._instruct_scorer = CompletionScorer(
            client,
            end_ids=marker,
            stop_token_ids=self.stop_ids,
            max_remaining_tokens=cc.max_remaining_tokens,
            decode=tokenizer.decode,
            variant="instruct",
            end_text=cc.instruct_end_marker,
        )
        tc = config.tree
        self._tree = TreeExpander(
            client,
            alpha=tc.alpha,
            budget=TreeBudget(tc.max_depth_tokens, tc.max_generated_tokens, tc.max_requests, tc.max_leaves),
            stop_token_ids=self.stop_ids,
            stop_strings=() if self.prompts.tree_chat else tc.stop_strings,
            decode=tokenizer.decode,
        )
        self.trust = AdapterTrust(config, lambda label, v: self.metrics.adapter_trusted.labels(label).set(v))
        self.trust.publish_configured(self._labels)
        self._goal = goal_labeler or _unknown_goal
        self._budgets: dict[str, TokenBucket] = {}
        self._slots: dict[str, Slots] = {}
        self._latest_turn: LruCache[str, int] = LruCache(_LATEST_TURNS)
        self._verdicts: LruCache[tuple[str, int, str], CompletionScore] = LruCache(_CACHE_SIZE)
        self._cpu = ThreadPoolExecutor(max_workers=_PROMPT_THREADS, thread_name_prefix="sidecar-prompt")

    # -- lifecycle --------------------------------------------------------------------------------

    async def start(self) -> None:
        if self._owned_client is not None:
            await self._owned_client.start()

    async def stop(self) -> None:
        self._cpu.shutdown(wait=False, cancel_futures=True)
        if self._owned_client is not None:
            await self._owned_client.stop()

    def health(self) -> Health:
        if self._owned_client is not None:
            return self._owned_client.health()
        return Health("vllm", True, "external client")

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

    async def _off_loop(self, fn: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._cpu, fn)

    async def _prompt(
        self, build: Callable[[Sequence[Message]], tuple[list[int], int]], ctx: TurnContext
    ) -> tuple[list[int], int]:
        """Encode c_k's prompt, off the event loop."""
        return await self._off_loop(lambda: build(self._messages(ctx)))

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
            reason = _reason(exc)
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
        cfg = self.config.agent(ctx.agent)
        route = self.trust.route(ctx.agent)
        self.trust.publish(label, route)
        key = (ctx.conversation_id, len(prefix_through_turn(ctx.messages, ctx.turn)), cfg.adapter or "")
        score = self._verdicts.get(key)
        if score is None:
            if cfg.adapter is not None and self._adapter_scorer is not None:
                scorer, model = self._adapter_scorer, cfg.adapter
                prompt, _ = await self._prompt(self.prompts.completion_adapter, ctx)
            else:
                scorer, model = self._instruct_scorer, self.config.vllm.base_model
                prompt, _ = await self._prompt(self.prompts.completion_instruct, ctx)
            score = await self._until_available("completion", lambda: scorer.score(model, prompt))
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

    async def score_adapter(self, messages: Sequence[Message], adapter: str) -> CompletionScore:
        """The adapter verdict on c_k = ``messages``: the prompt and scorer the hooks use, no scheduling.

        Offline evaluation (``adapters eval``) calls this so its figures are what the sidecar sees.
        """
        if self._adapter_scorer is None:
            raise ConfigError(f"the end tag {self.config.completion.end_tag!r} is not a token of the tokenizer")
        prompt, _ = await self._off_loop(lambda: self.prompts.completion_adapter(messages))
        return await self._adapter_scorer.score(adapter, prompt)

    def on_turn_closed(self, ctx: TurnContext) -> HookResult:
        label = self._agent_label(ctx.agent)
        cfg = self.config.agent(ctx.agent)
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
            return Scored(
                {**self._outcome(ctx, score), "final": True, "goal": goal},
                [self._completion_event(ctx, score, final=True)],
            )

        return self._guard("final", label, work)

    def _completion_event(self, ctx: TurnContext, score: CompletionScore, *, final: bool) -> CompletionScored:
        # Events stay in the process (sinks decide what text, if any, leaves it).
        adapter = self.config.agent(ctx.agent).adapter
        return CompletionScored(
            p_end=score.p_end,
            complete=score.complete,
            variant=score.variant,
            model=adapter if score.variant == "adapter" and adapter else self.config.vllm.base_model,
            final=final,
            remaining_tasks=None if score.complete else score.remaining_text,
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
        cfg = self.config.agent(ctx.agent)
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
            prompt, dropped = await self._prompt(self.prompts.tree, ctx)
            model = cfg.tree_model or self.config.vllm.base_model
            tree = await self._until_available("tree", lambda: self._tree.expand(model, prompt))
            bucket.spend(tree.generated_tokens)
            stats = tree.stats()
            best = stats["max_logprob"]
            self.metrics.tree_leaves.labels(label).observe(tree.leaves)
            self.metrics.tree_tokens.labels(label).observe(tree.generated_tokens)
            if best is not None:
                self.metrics.tree_max_logprob.labels(label).observe(best)
            if tree.budget_hit:
                self.metrics.tree_budget_hits.labels(label, tree.budget_hit).inc()
            text = most_probable_text(tree, self.tok.decode, self.stop_ids)
            out: dict[str, Any] = {**stats, "turns_dropped": dropped}
            if tc.include_text_in_outcome:
                out["best_branch"] = text
            views = [TreeBranch(*v) for v in branch_views(tree, self.tok.decode, self.stop_ids)]
            return Scored(out, [tree_event(tree, model, text, views)])

        return self._guard("tree", label, work)


def _end_tag_id(tokenizer: SafeTokenizer, end_tag: str, config: ScoringConfig) -> int | None:
    """The end tag's id; None is allowed only when no agent routes to an adapter."""
    try:
        return tokenizer.token_id(end_tag)
    except ConfigError:
        agents = [config.default_agent, *config.agents.values()]
        if any(a.adapter is not None for a in agents):
            raise ConfigError(
                f"the end tag {end_tag!r} is not a single token of the served tokenizer, but agents route "
                "to completion adapters (set scoring.completion.end_tag to the adapters' end token)"
            ) from None
        return None


def _reason(exc: BaseException) -> str:
    if isinstance(exc, PromptTooLong):
        return "prompt_too_long"
    if isinstance(exc, UnsafeContentError):
        return "unsafe_content"
    reason = getattr(exc, "reason", None)
    return reason if isinstance(reason, str) else type(exc).__name__
