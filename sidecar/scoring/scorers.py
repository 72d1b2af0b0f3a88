"""``Scorers``: the scoring machinery one config builds, with no scheduling around it.

From a :class:`~sidecar.scoring.config.ScoringConfig` and an :class:`~sidecar.scoring.client.LLMClient`
it builds the served tokenizer, the prompt builder, the completion scorers (adapter and instruct),
the response-tree expander and the adapter trust assessment. Both users share it, so they send the
same prompts to the same scorers:

* the live policy, :class:`~sidecar.scoring.hooks.ScoringHooks`, which adds sampling, token budgets,
  the tree debounce, waiting out outages, and turns errors into outcomes;
* offline tools (``sidecar eval``, ``adapters eval``, the benchmarks), which score what they are
  given, every item, and decide themselves what a failure means.

Guarantees: prompts are encoded on a small thread pool, never on the event loop; nothing here
samples, spends a budget, caches or retries beyond the client's own retry layer; errors propagate
(:class:`~sidecar.scoring.prompts.PromptTooLong`,
:class:`~sidecar.transcript.tokenize.UnsafeContentError`, :class:`~sidecar.errors.PermanentError`,
:class:`~sidecar.errors.RetryableError`, cancellation).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

from prometheus_client import CollectorRegistry

from sidecar.contract import TreeBranch, TreeScored
from sidecar.errors import ConfigError
from sidecar.lifecycle import Health
from sidecar.scoring.client import LLMClient, VllmClient
from sidecar.scoring.completion import CompletionScore, CompletionScorer
from sidecar.scoring.config import ScoringConfig
from sidecar.scoring.prompts import PromptBuilder, PromptTooLong
from sidecar.scoring.tree import ResponseTree, TreeBudget, TreeExpander, branch_views, most_probable_text, tree_event
from sidecar.scoring.trust import AdapterTrust
from sidecar.transcript.model import Message
from sidecar.transcript.tokenize import SafeTokenizer, UnsafeContentError

T = TypeVar("T")
TrustGauge = Callable[[str, float], None]
# Tokenisation scales with a conversation's length: it runs on these threads, never
# on the event loop (the Kafka heartbeat and every other partition share that loop).
_PROMPT_THREADS = 2


def _no_gauge(_label: str, _value: float) -> None:
    return None


@dataclass(frozen=True, slots=True)
class CompletionRequest:
    """One completion verdict ready to send: its scorer, the served model and the encoded prompt.

    :meth:`score` may be awaited again after a retryable error: the prompt is not re-encoded.
    """

    scorer: CompletionScorer
    model: str
    prompt: list[int]
    turns_dropped: int

    async def score(self) -> CompletionScore:
        return await self.scorer.score(self.model, self.prompt)


@dataclass(frozen=True, slots=True)
class TreeRequest:
    """One response tree ready to expand: the expander, the served model and the encoded prompt.

    :meth:`expand` may be awaited again after a retryable error: the prompt is not re-encoded.
    """

    expander: TreeExpander
    model: str
    prompt: list[int]
    turns_dropped: int

    async def expand(
        self, *, probe_tokens: int | None = None, grow: Callable[[ResponseTree], bool] | None = None
    ) -> ResponseTree:
        """The tree; with ``grow``, a probe first and the rest only if ``grow(tree)`` says so
        (:meth:`~sidecar.scoring.tree.TreeExpander.expand`)."""
        return await self.expander.expand(self.model, self.prompt, probe_tokens=probe_tokens, grow=grow)


class Scorers:
    """Tokenizer, prompts, completion scorers, tree expander and adapter trust for one config.

    ``client`` is used as given, and its lifecycle is the caller's; :meth:`from_config` builds a
    :class:`~sidecar.scoring.client.VllmClient` that :meth:`start`, :meth:`stop` and :meth:`health`
    then own. ``trust_gauge(label, value)`` receives the adapter-trusted gauge's values (the live
    policy exports them; offline the default drops them).
    """

    def __init__(
        self,
        config: ScoringConfig,
        client: LLMClient,
        *,
        tokenizer: SafeTokenizer | None = None,
        trust_gauge: TrustGauge | None = None,
    ) -> None:
        self.config = config
        self.client = client
        self._owned_client: VllmClient | None = None
        if tokenizer is None:
            if config.tokenizer.model_dir is None:
                raise ConfigError("scoring.tokenizer.model_dir is required")
            tokenizer = SafeTokenizer.from_model_dir(
                config.tokenizer.model_dir, extra_special=config.tokenizer.special_tokens
            )
        self.tokenizer = tokenizer
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
        self.adapter_scorer = (
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
        self.instruct_scorer = CompletionScorer(
            client,
            end_ids=marker,
            stop_token_ids=self.stop_ids,
            max_remaining_tokens=cc.max_remaining_tokens,
            decode=tokenizer.decode,
            variant="instruct",
            end_text=cc.instruct_end_marker,
        )
        tc = config.tree
        self.tree = TreeExpander(
            client,
            alpha=tc.alpha,
            budget=TreeBudget(tc.max_depth_tokens, tc.max_generated_tokens, tc.max_requests, tc.max_leaves),
            stop_token_ids=self.stop_ids,
            stop_strings=() if self.prompts.tree_chat else tc.stop_strings,
            decode=tokenizer.decode,
        )
        self.trust = AdapterTrust(config, trust_gauge or _no_gauge)
        self._cpu = ThreadPoolExecutor(max_workers=_PROMPT_THREADS, thread_name_prefix="sidecar-prompt")

    @classmethod
    def from_config(
        cls,
        config: ScoringConfig,
        registry: CollectorRegistry,
        *,
        tokenizer: SafeTokenizer | None = None,
        trust_gauge: TrustGauge | None = None,
    ) -> Scorers:
        """Scorers on a :class:`VllmClient` for ``config.vllm`` (its metrics on ``registry``), owned."""
        client = VllmClient(config.vllm, registry, max_logprobs=config.max_logprobs)
        scorers = cls(config, client, tokenizer=tokenizer, trust_gauge=trust_gauge)
        scorers._owned_client = client
        return scorers

    # -- lifecycle --------------------------------------------------------------------------------

    async def start(self) -> None:
        """Start the owned client, if any; returns at once."""
        if self._owned_client is not None:
            await self._owned_client.start()

    async def stop(self) -> None:
        """Stop the prompt threads and the owned client; idempotent, safe without :meth:`start`."""
        self._cpu.shutdown(wait=False, cancel_futures=True)
        if self._owned_client is not None:
            await self._owned_client.stop()

    def health(self) -> Health:
        if self._owned_client is not None:
            return self._owned_client.health()
        return Health("vllm", True, "external client")

    # -- routing ----------------------------------------------------------------------------------

    def tree_model(self, agent: str | None) -> str:
        """The served model that expands ``agent``'s response trees."""
        return self.config.agent(agent).tree_model or self.config.vllm.base_model

    # -- prompts and requests ---------------------------------------------------------------------

    async def off_loop(self, fn: Callable[[], T]) -> T:
        """``fn()`` on the prompt threads."""
        return await asyncio.get_running_loop().run_in_executor(self._cpu, fn)

    async def completion_request(self, messages: Sequence[Message], adapter: str | None) -> CompletionRequest:
        """The verdict on c_k = ``messages``: with ``adapter`` (and an end-tag token), the adapter
        prompt on that adapter; else the instruct prompt on the base model."""
        if adapter is not None and self.adapter_scorer is not None:
            scorer, model, build = self.adapter_scorer, adapter, self.prompts.completion_adapter
        else:
            scorer, model, build = self.instruct_scorer, self.config.vllm.base_model, self.prompts.completion_instruct
        prompt, dropped = await self.off_loop(lambda: build(messages))
        return CompletionRequest(scorer, model, prompt, dropped)

    async def score_adapter(self, messages: Sequence[Message], adapter: str) -> CompletionScore:
        """The adapter verdict on c_k = ``messages``: the prompt and scorer the live hooks use.

        Offline evaluation (``adapters eval``, ``sidecar eval``) calls this so its figures are what
        the sidecar sees. :class:`~sidecar.errors.ConfigError` when the end tag is not a token.
        """
        if self.adapter_scorer is None:
            raise ConfigError(f"the end tag {self.config.completion.end_tag!r} is not a token of the tokenizer")
        return await (await self.completion_request(messages, adapter)).score()

    async def tree_request(self, messages: Sequence[Message], model: str) -> TreeRequest:
        """The response tree after ``messages`` (ending with a user message) on ``model``."""
        prompt, dropped = await self.off_loop(lambda: self.prompts.tree(messages))
        return TreeRequest(self.tree, model, prompt, dropped)

    def best_branch_text(self, tree: ResponseTree) -> str:
        """The most probable branch's text, decoded."""
        return most_probable_text(tree, self.tokenizer.decode, self.stop_ids)

    def tree_scored(self, tree: ResponseTree, model: str, best_branch: str) -> TreeScored:
        """The tree as the post-score stage sees it, every branch decoded for drawing."""
        views = [TreeBranch(*v) for v in branch_views(tree, self.tokenizer.decode, self.stop_ids)]
        return tree_event(tree, model, best_branch, views)


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


def failure_reason(exc: BaseException) -> str:
    """The closed-set reason a scoring failure is counted and reported under."""
    if isinstance(exc, PromptTooLong):
        return "prompt_too_long"
    if isinstance(exc, UnsafeContentError):
        return "unsafe_content"
    reason = getattr(exc, "reason", None)
    return reason if isinstance(reason, str) else type(exc).__name__
