"""The three language decisions of Algorithm 1, behind one small protocol.

:class:`OpenAIGoalLLM` asks an instruct model through any OpenAI-compatible chat endpoint (vLLM in
production) for JSON answers, schema-guided where the server supports ``response_format`` of type
``json_schema``, and validates them with pydantic. An answer that does not validate gets a safe
default - the extractive summary, the previous (or an extractive) label, no merge - and is counted in
``sidecar_clustering_llm_invalid_answers_total{kind}``. Requests go through the shared
:class:`~sidecar.llm.endpoint.LlmEndpoint` (its classification, retry and breaker, as configured in
``clustering.llm``); a request that fails (timeout, refused connection, HTTP error) is counted in
``sidecar_clustering_llm_errors_total{kind}`` and raised as :class:`RetryableError` /
:class:`PermanentError`: an outage must abort a re-clustering run (the live clusters are kept), not
silently turn it into "nothing merges".

:class:`ExtractiveGoalLLM` is the LLM-free mode, for deployments without an instruct model. It is
documented as the weaker option: summaries are the user's own first messages, labels are phrases
that separate a cluster's members from the other clusters (class-based TF-IDF,
:mod:`sidecar.clustering.naming`), and two clusters merge when their centroids' cosine similarity
reaches a threshold.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar, runtime_checkable

import openai
import structlog
from pydantic import BaseModel, ValidationError

from sidecar.clustering.config import ClusteringConfig, ClusteringLLMConfig
from sidecar.clustering.metrics import ClusteringMetrics
from sidecar.clustering.naming import goal_name, name_clusters
from sidecar.clustering.prompts import (
    DescribeAnswer,
    MergeAnswer,
    SummaryAnswer,
    describe_messages,
    merge_messages,
    one_line,
    summary_messages,
)
from sidecar.llm.endpoint import CallObserver, Failure, LlmEndpoint
from sidecar.transcript.model import Message

log = structlog.get_logger()

A = TypeVar("A", bound=BaseModel)


@dataclass(frozen=True, slots=True)
class MergeQuery:
    """Everything a merge decision may look at: sampled summaries and two similarities."""

    group1: Sequence[str]
    group2: Sequence[str]
    others: Sequence[str]
    label1: str
    label2: str
    centroid_similarity: float
    description_similarity: float


class GoalLLM(Protocol):
    """Summarise one conversation, describe one cluster, decide one merge.

    Guarantees: never raises on a bad *answer* (safe default instead); raises
    :class:`sidecar.errors.SidecarError` subclasses only when the backend cannot be reached.
    """

    @property
    def describe_examples(self) -> int:
        """How many members (and non-members) a description should be shown."""
        ...

    async def summarize(self, transcript: Sequence[Message]) -> str: ...

    async def describe(self, group: Sequence[str], not_in_group: Sequence[str], previous: str | None = None) -> str: ...

    async def should_merge(self, query: MergeQuery) -> bool: ...


@runtime_checkable
class ClusterNamer(Protocol):
    """A :class:`GoalLLM` that also names the final clusters, each against all the others.

    Algorithm 1 calls it once per run, after the merge loop, with a seeded sample of up to
    ``describe_examples`` members per cluster; its names replace the loop's labels. Guarantees:
    one name per group, deterministic, never raises on any text.
    """

    @property
    def describe_examples(self) -> int: ...

    def name_clusters(self, groups: Sequence[Sequence[str]]) -> list[str]: ...


# --------------------------------------------------------------------------------------------
# LLM-free building blocks


def extractive_summary(transcript: Sequence[Message], max_chars: int) -> str:
    """The user's own words, first messages first: the goal is usually stated early."""
    parts: list[str] = []
    used = 0
    for m in transcript:
        if m.role != "user":
            continue
        text = one_line(m.content, max_chars)
        if not text:
            continue
        parts.append(text)
        used += len(text) + 1
        if used >= max_chars:
            break
    return " ".join(parts)[:max_chars]


class ExtractiveGoalLLM:
    """The LLM-free mode (weaker; no instruct model needed)."""

    def __init__(self, config: ClusteringConfig) -> None:
        self._max_summary = config.max_summary_chars
        self._min_df = config.keyword_min_document_frequency
        self._threshold = config.merge_similarity_threshold
        # Keywords need more than ten examples to be representative, and cost nothing.
        self._describe_examples = max(config.examples_per_group, 10 * config.examples_per_group)

    @property
    def describe_examples(self) -> int:
        return self._describe_examples

    async def summarize(self, transcript: Sequence[Message]) -> str:
        return extractive_summary(transcript, self._max_summary)

    async def describe(self, group: Sequence[str], not_in_group: Sequence[str], previous: str | None = None) -> str:
        del previous  # names are recomputed from the members; nothing to keep
        return goal_name(group, not_in_group, min_df=self._min_df)

    def name_clusters(self, groups: Sequence[Sequence[str]]) -> list[str]:
        return name_clusters(groups, min_df=self._min_df)

    async def should_merge(self, query: MergeQuery) -> bool:
        return query.centroid_similarity >= self._threshold


# --------------------------------------------------------------------------------------------
# Instruct model over the OpenAI-compatible chat API


def _schema(model: type[BaseModel], name: str) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": name, "schema": model.model_json_schema()}}


_FENCE = re.compile(r"^```(?:json)?\s*|\s*```$", re.IGNORECASE)


def parse_answer(raw: str | None, model: type[A]) -> A | None:
    """The validated answer, or None when ``raw`` is not JSON of ``model``'s schema."""
    if not raw:
        return None
    text = _FENCE.sub("", raw.strip())
    try:
        return model.model_validate(json.loads(text))
    except (ValueError, ValidationError, RecursionError):
        return None


class _ClusteringCallLog(CallObserver):
    """One request's error counter and log events, by decision kind."""

    def __init__(self, metrics: ClusteringMetrics, kind: str) -> None:
        self._metrics = metrics
        self._kind = kind

    def failed(self, failure: Failure) -> None:
        self._metrics.llm_errors.labels(self._kind).inc()
        error = type(failure.exc).__name__
        if failure.status is not None and failure.status != 429:  # 429 is logged as unavailable, as before
            log.warning("clustering.llm_http_error", kind=self._kind, status=failure.status)
        elif failure.kind == "retryable":
            log.warning("clustering.llm_unavailable", kind=self._kind, error=error)
        else:
            log.warning("clustering.llm_bad_response", kind=self._kind, error=error)


class OpenAIGoalLLM:
    """Algorithm 1's LLM over the shared :class:`~sidecar.llm.endpoint.LlmEndpoint`."""

    def __init__(
        self,
        config: ClusteringConfig,
        metrics: ClusteringMetrics,
        client: openai.AsyncOpenAI | None = None,
    ) -> None:
        llm: ClusteringLLMConfig = config.llm
        self._cfg = llm
        self._metrics = metrics
        self._max_summary = config.max_summary_chars
        self._min_df = config.keyword_min_document_frequency
        self._examples = config.examples_per_group
        self._endpoint = LlmEndpoint(llm, client=client)
        self._client = self._endpoint.client

    @property
    def describe_examples(self) -> int:
        return self._examples

    async def aclose(self) -> None:
        await self._endpoint.aclose()

    async def _ask(self, kind: str, messages: list[dict[str, str]], answer: type[A]) -> A | None:
        kwargs: dict[str, Any] = {
            "model": self._cfg.model,
            "messages": messages,
            "max_tokens": self._cfg.max_tokens,
            "temperature": self._cfg.temperature,
        }
        if self._cfg.guided_json:
            kwargs["response_format"] = _schema(answer, kind)
        self._metrics.llm_calls.labels(kind).inc()
        resp = await self._endpoint.call(
            lambda: self._client.chat.completions.create(**kwargs), _ClusteringCallLog(self._metrics, kind)
        )
        content = resp.choices[0].message.content if resp.choices else None
        parsed = parse_answer(content, answer)
        if parsed is None:
            self._metrics.llm_invalid_answers.labels(kind).inc()
            log.info("clustering.llm_invalid_answer", kind=kind, chars=len(content or ""))
        return parsed

    async def summarize(self, transcript: Sequence[Message]) -> str:
        messages = summary_messages(transcript, self._cfg.application_context, self._cfg.max_transcript_chars)
        ans = await self._ask("summarize", messages, SummaryAnswer)
        if ans is None:
            return extractive_summary(transcript, self._max_summary)
        return one_line(ans.intent, self._max_summary)

    async def describe(self, group: Sequence[str], not_in_group: Sequence[str], previous: str | None = None) -> str:
        ans = await self._ask("describe", describe_messages(group, not_in_group), DescribeAnswer)
        if ans is None:
            return previous or goal_name(group, not_in_group, min_df=self._min_df)
        return one_line(ans.description, 300)

    async def should_merge(self, query: MergeQuery) -> bool:
        ans = await self._ask("merge", merge_messages(query.group1, query.group2, query.others), MergeAnswer)
        return bool(ans is not None and ans.merge)
