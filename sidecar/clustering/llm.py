"""The three language decisions of Algorithm 1, behind one small protocol.

:class:`OpenAIGoalLLM` asks an instruct model through any OpenAI-compatible chat endpoint (vLLM in
production) for JSON answers, schema-guided where the server supports ``response_format`` of type
``json_schema``, and validates them with pydantic. An answer that does not validate gets a safe
default - the extractive summary, the previous (or a keyword) label, no merge - and is counted in
``sidecar_clustering_llm_invalid_answers_total{kind}``. Requests go through the shared
:class:`~sidecar.llm.endpoint.LlmEndpoint` (its classification, retry and breaker, as configured in
``clustering.llm``); a request that fails (timeout, refused connection, HTTP error) is counted in
``sidecar_clustering_llm_errors_total{kind}`` and raised as :class:`RetryableError` /
:class:`PermanentError`: an outage must abort a re-clustering run (the live clusters are kept), not
silently turn it into "nothing merges".

:class:`ExtractiveGoalLLM` is the LLM-free mode, for deployments without an instruct model. It is
documented as the weaker option: summaries are the user's own first messages, labels are keywords
that separate a cluster's members from non-members, and two clusters merge when their centroids'
cosine similarity reaches a threshold.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import openai
import structlog
from pydantic import BaseModel, ValidationError

from sidecar.clustering.config import ClusteringConfig, ClusteringLLMConfig
from sidecar.clustering.metrics import ClusteringMetrics
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


# --------------------------------------------------------------------------------------------
# LLM-free building blocks


_WORD = re.compile(r"[a-z][a-z'-]{2,24}")
_STOPWORDS_TEXT = """
    a about above after again against all also am an and any are aren't as at be because been before
    being below between both but by can can't cannot could couldn't did didn't do does doesn't doing
    don't down during each few for from further get got had hadn't has hasn't have haven't having he
    her here hers herself him himself his how i i'd i'll i'm i've if in into is isn't it it's its
    itself just let's like me more most much must my myself need needs no nor not now of off on once
    only or other ought our ours ourselves out over own please same shall she should shouldn't so
    some such than that that's the their theirs them themselves then there there's these they this
    those through to too under until up upon us very want wanted wants was wasn't we we'd we'll
    we're were weren't what what's when where which while who whom why will with won't would
    wouldn't you you'd you'll you're you've your yours yourself yes yeah okay ok thanks thank hi
    hello hey great good fine sure sounds perfect cool awesome alright right one two three four
    five also something anything else actually maybe really well know think going help look
    looking find give tell make see said say go way time day bye goodbye much many lot
"""
STOPWORDS = frozenset(_STOPWORDS_TEXT.split())


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


def keywords(text: str) -> set[str]:
    """Lower-case content words of ``text`` (no digits, no stopwords)."""
    return {w.strip("'-") for w in _WORD.findall(text.lower()) if w not in STOPWORDS} - {""}


def keyword_label(group: Sequence[str], not_in_group: Sequence[str], *, min_df: int, n_words: int = 3) -> str:
    """The words most typical of ``group`` against ``not_in_group``.

    A word qualifies only if at least ``min_df`` members use it (never fewer, however small the
    group), so a label is made of words many users typed, never one user's name or number. Ties
    break alphabetically.
    """
    pos = Counter(w for s in group for w in keywords(s))
    neg = Counter(w for s in not_in_group for w in keywords(s))
    need = max(1, min_df)
    n_pos, n_neg = max(1, len(group)), max(1, len(not_in_group))
    scored = [(pos[w] / n_pos - neg[w] / n_neg + 0.01 * math.log1p(pos[w]), w) for w in pos if pos[w] >= need]
    scored.sort(key=lambda t: (-t[0], t[1]))
    words = [w for _, w in scored[:n_words]]
    return " / ".join(words) if words else "miscellaneous"


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
        del previous  # keywords are recomputed from the members; nothing to keep
        return keyword_label(group, not_in_group, min_df=self._min_df)

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
            return previous or keyword_label(group, not_in_group, min_df=self._min_df)
        return one_line(ans.description, 300)

    async def should_merge(self, query: MergeQuery) -> bool:
        ans = await self._ask("merge", merge_messages(query.group1, query.group2, query.others), MergeAnswer)
        return bool(ans is not None and ans.merge)
