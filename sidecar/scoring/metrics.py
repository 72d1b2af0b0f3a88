"""Scoring metrics. Labels are closed sets: ``agent`` is a configured agent name, ``default``
(no agent on the event) or ``other`` (an agent the config does not list); ``goal`` comes from the
goal labeler: a stable goal id, bounded (top N plus ``other`` and ``unknown``), never text; names
are in ``sidecar_goal_info``; ``kind``/``reason``/``outcome`` are fixed."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Enum, Gauge, Histogram

_PROB_BUCKETS = (0.001, 0.01, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99, 1.0)
_LEAF_BUCKETS = (1, 2, 3, 5, 8, 13, 21, 34, 55, 89, 144, 256, 512)
_LOGPROB_BUCKETS = (-50.0, -30.0, -20.0, -15.0, -10.0, -7.5, -5.0, -3.0, -2.0, -1.0, -0.5, -0.1, 0.0)
_TOKEN_BUCKETS = (8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
_LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


class ScoringMetrics:
    """The scorers' metrics on one registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.p_end = Histogram(
            "sidecar_completion_probability",
            "P(end tag | conversation so far) per scored turn.",
            ["agent"],
            buckets=_PROB_BUCKETS,
            registry=registry,
        )
        self.turns_scored = Counter(
            "sidecar_completion_scored_total",
            "Completion verdicts by outcome (complete, incomplete).",
            ["agent", "outcome"],
            registry=registry,
        )
        self.conversations_ended = Counter(
            "sidecar_conversations_ended_total",
            "Conversations ended, by final completion verdict and goal id (names: sidecar_goal_info).",
            ["agent", "outcome", "goal"],
            registry=registry,
        )
        self.adapter_trusted = Gauge(
            "sidecar_completion_adapter_trusted",
            "1 if the agent's completion adapter has a recorded validation F1 at or above "
            "scoring.completion.min_validation_f1, else 0 (none configured, unvalidated, or below the floor).",
            ["agent"],
            registry=registry,
        )
        self.tree_leaves = Histogram(
            "sidecar_tree_leaves", "Leaves per response tree.", ["agent"], buckets=_LEAF_BUCKETS, registry=registry
        )
        self.tree_max_logprob = Histogram(
            "sidecar_tree_max_logprob",
            "Logprob of the most probable branch per response tree.",
            ["agent"],
            buckets=_LOGPROB_BUCKETS,
            registry=registry,
        )
        self.tree_tokens = Histogram(
            "sidecar_tree_tokens", "Generated tokens per response tree.", ["agent"], buckets=_TOKEN_BUCKETS,
            registry=registry,
        )  # fmt: skip
        self.tree_budget_hits = Counter(
            "sidecar_tree_budget_hits_total",
            "Response trees truncated by a budget, by limit.",
            ["agent", "limit"],
            registry=registry,
        )
        self.tree_gate = Counter(
            "sidecar_tree_gate_total",
            "Response trees through the tree gate (scoring.tree.gate), by decision: grown_uncertain (the probe's "
            "logprob among the agent's lowest grow_share), grown_warming_up (too few probes yet), skipped_confident "
            "(the probe's greedy branch is the outcome).",
            ["agent", "decision"],
            registry=registry,
        )
        self.completion_requests = Histogram(
            "sidecar_completion_requests",
            "vLLM requests one completion verdict took (1 with exact logprob requests; 2-3 when the end tag "
            "is outside the top-k and a forced or prompt-logprobs request follows).",
            ["agent"],
            buckets=(1, 2, 3, 4, 6),
            registry=registry,
        )
        self.latency = Histogram(
            "sidecar_scoring_duration_seconds",
            "Time from hook call to outcome, waiting included.",
            ["agent", "kind"],
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
        self.errors = Counter(
            "sidecar_scoring_errors_total",
            "Scoring calls that ended with a permanent error.",
            ["agent", "kind", "reason"],
            registry=registry,
        )
        self.skipped = Counter(
            "sidecar_scoring_skipped_total",
            "Scoring calls not made (sampling, token budget, disabled).",
            ["agent", "kind", "reason"],
            registry=registry,
        )
        self.backpressure_waits = Counter(
            "sidecar_scoring_backpressure_waits_total",
            "Times a scoring call waited for vLLM to come back instead of failing.",
            ["kind"],
            registry=registry,
        )


class VllmMetrics:
    """Per served model: latency, tokens, errors, retries; breaker state and requests in flight."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.latency = Histogram(
            "sidecar_vllm_request_duration_seconds",
            "Latency of one vLLM request attempt.",
            ["model"],
            registry=registry,
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
        )
        self.prompt_tokens = Counter(
            "sidecar_vllm_prompt_tokens_total", "Prompt tokens sent to vLLM.", ["model"], registry=registry
        )
        self.generated_tokens = Counter(
            "sidecar_vllm_generated_tokens_total", "Tokens vLLM generated.", ["model"], registry=registry
        )
        self.errors = Counter(
            "sidecar_vllm_request_errors_total",
            "Failed vLLM request attempts by kind (retryable, permanent).",
            ["model", "kind"],
            registry=registry,
        )
        self.breaker = Gauge(
            "sidecar_vllm_circuit_breaker_state",
            "vLLM circuit breaker: 0 closed, 1 half-open, 2 open.",
            registry=registry,
        )
        self.in_flight = Gauge("sidecar_vllm_requests_in_flight", "vLLM requests in flight.", registry=registry)
        self.up = Gauge("sidecar_vllm_up", "1 if vLLM's /health answered at the last probe.", registry=registry)
        self.exact_mode = Enum(
            "sidecar_vllm_exact_logprobs_mode",
            "How completion verdicts get an exact P(end): one logprob_token_ids request (shared or isolated), "
            "or the top-k + forced-request path (off); auto until the first verdict's self-test.",
            states=["auto", "shared", "isolated", "off"],
            registry=registry,
        )
        self.mixed_batches_mode = Enum(
            "sidecar_vllm_mixed_batches_mode",
            "Whether this client lets base-model and LoRA-adapter requests share the server's batches (shared) or "
            "never has both in flight at once (separated); auto until the self-test before the first adapter request.",
            states=["auto", "shared", "separated"],
            registry=registry,
        )
        self.self_tests = Counter(
            "sidecar_vllm_self_tests_total",
            "Self-tests of the vLLM server by test (mixed_batches, exact_logprobs) and verdict (harmless, defect); "
            "auto modes repeat a harmless one every scoring.vllm.self_test_interval_seconds.",
            ["test", "verdict"],
            registry=registry,
        )
