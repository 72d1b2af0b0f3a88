"""``TwoDimensionalJudge``: two separate judgements of one conversation, then the decision rule.

Guarantees: ``judge()`` never raises because of an answer or an endpoint failure. A malformed
answer gives the dimension's safe default and ``sidecar_judge_invalid_answers_total{dimension}``;
a request that fails after the retry layer gives ``error`` (``unavailable``, ``prompt_too_long``,
``http_400``...) and ``sidecar_judge_errors_total{dimension,kind}``. Either way the conversation is
not complete and not decided. Cancellation propagates. Calls and tokens are counted per verdict
and on the metrics.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

import structlog

from sidecar.errors import PermanentError, RetryableError
from sidecar.judge.chat import ChatClient, OpenAIChatClient
from sidecar.judge.config import JudgeConfig
from sidecar.judge.metrics import JudgeMetrics
from sidecar.judge.prompts import DIMENSIONS, Dimension, PromptLimits, answer_schema, judge_messages
from sidecar.judge.verdict import DimensionVerdict, JudgeVerdict, parse_dimension
from sidecar.transcript.model import Message

log = structlog.get_logger()


class TwoDimensionalJudge:
    """Accuracy and completeness of an agent's handling of a conversation (see the module docstring)."""

    def __init__(self, config: JudgeConfig, metrics: JudgeMetrics, client: ChatClient | None = None) -> None:
        self.config = config
        self.metrics = metrics
        self._owned: OpenAIChatClient | None = None
        if client is None:
            self._owned = OpenAIChatClient(config.llm)
            client = self._owned
        self.client = client
        self.limits = PromptLimits(
            config.max_message_chars, config.max_transcript_chars, config.include_system_messages
        )

    async def aclose(self) -> None:
        """Close the client this judge created (not one it was given); idempotent."""
        if self._owned is not None:
            await self._owned.aclose()

    def prompt(self, dimension: Dimension, messages: Sequence[Message]) -> list[dict[str, str]]:
        """The chat request of one judgement (what :meth:`judge` sends)."""
        return judge_messages(dimension, messages, self.limits, self.config.agent_description)

    async def judge(self, messages: Sequence[Message]) -> JudgeVerdict:
        """Both judgements, concurrently, and the decision (complete iff both pass)."""
        t0 = time.monotonic()
        # Rendering scales with the conversation's length: off the event loop, which the Kafka
        # heartbeat and every partition share.
        requests = await asyncio.to_thread(lambda: {d: self.prompt(d, messages) for d in DIMENSIONS})
        async with asyncio.TaskGroup() as tg:
            acc = tg.create_task(self._dimension("accuracy", requests["accuracy"]))
            comp = tg.create_task(self._dimension("completeness", requests["completeness"]))
        verdict = JudgeVerdict(acc.result(), comp.result())
        errors = verdict.accuracy.error is not None or verdict.completeness.error is not None
        self.metrics.verdicts.labels("error" if errors else verdict.label).inc()
        self.metrics.duration.observe(time.monotonic() - t0)
        return verdict

    async def _dimension(self, dimension: Dimension, request: list[dict[str, str]]) -> DimensionVerdict:
        self.metrics.calls.labels(dimension).inc()
        try:
            reply = await self.client.chat(request, schema=answer_schema(dimension), name=f"judge_{dimension}")
        except RetryableError as exc:
            self.metrics.errors.labels(dimension, "retryable").inc()
            log.warning("judge.unavailable", dimension=dimension, error=type(exc).__name__)
            return DimensionVerdict(dimension, None, error="unavailable", calls=1)
        except PermanentError as exc:
            reason = getattr(exc, "reason", None)
            reason = reason if isinstance(reason, str) else type(exc).__name__
            self.metrics.errors.labels(dimension, "permanent").inc()
            log.warning("judge.request_failed", dimension=dimension, reason=reason)
            return DimensionVerdict(dimension, None, error=reason, calls=1)
        self.metrics.prompt_tokens.labels(dimension).inc(reply.prompt_tokens)
        self.metrics.completion_tokens.labels(dimension).inc(reply.completion_tokens)
        parsed = parse_dimension(
            dimension, reply.content, max_items=self.config.max_items, max_answer_chars=self.config.max_answer_chars
        )
        if parsed is None:
            self.metrics.invalid_answers.labels(dimension).inc()
            log.info(
                "judge.invalid_answer", dimension=dimension, chars=len(reply.content), finish_reason=reply.finish_reason
            )
            return DimensionVerdict(
                dimension,
                None,
                malformed=True,
                prompt_tokens=reply.prompt_tokens,
                completion_tokens=reply.completion_tokens,
                calls=1,
            )
        passed, items, explanation = parsed
        return DimensionVerdict(
            dimension,
            passed,
            items,
            explanation,
            prompt_tokens=reply.prompt_tokens,
            completion_tokens=reply.completion_tokens,
            calls=1,
        )
