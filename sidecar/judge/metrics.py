"""Prometheus metrics of the judge. Labels are closed sets: ``dimension`` (accuracy, completeness),
``kind`` (retryable, permanent), ``verdict`` (complete, incomplete, undecided, error), ``reason``
(disabled, no_user_turn, sampled_out, call_budget, token_budget, overloaded)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

_LATENCY_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


class JudgeMetrics:
    """Every judge metric, created on the registry the caller owns."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.calls = Counter(
            "sidecar_judge_calls_total",
            "Chat requests made by the judge, by dimension.",
            ["dimension"],
            registry=registry,
        )
        self.invalid_answers = Counter(
            "sidecar_judge_invalid_answers_total",
            "Judge answers that were not valid JSON of the asked schema; the safe default (not passed) was used.",
            ["dimension"],
            registry=registry,
        )
        self.errors = Counter(
            "sidecar_judge_errors_total",
            "Judge requests that failed after the retry layer, by dimension and kind (retryable, permanent).",
            ["dimension", "kind"],
            registry=registry,
        )
        self.prompt_tokens = Counter(
            "sidecar_judge_prompt_tokens_total",
            "Prompt tokens the judge's endpoint reported, by dimension.",
            ["dimension"],
            registry=registry,
        )
        self.completion_tokens = Counter(
            "sidecar_judge_completion_tokens_total",
            "Generated tokens the judge's endpoint reported, by dimension.",
            ["dimension"],
            registry=registry,
        )
        self.verdicts = Counter(
            "sidecar_judge_conversations_total",
            "Conversations judged, by verdict (complete, incomplete, undecided, error).",
            ["verdict"],
            registry=registry,
        )
        self.skipped = Counter(
            "sidecar_judge_skipped_total",
            "Ended conversations not judged, by reason (disabled, no_user_turn, sampled_out, call_budget, "
            "token_budget, overloaded).",
            ["reason"],
            registry=registry,
        )
        self.duration = Histogram(
            "sidecar_judge_duration_seconds",
            "Time to judge one conversation (both dimensions, retries included).",
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
