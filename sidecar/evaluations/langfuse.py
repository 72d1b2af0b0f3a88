"""Langfuse scores: ``POST {url}/api/public/scores``, one score per request, idempotent on ``id``.

Shape (Langfuse public API, ``ScoreBody``): ``id`` (the result's stable id, so a re-sent score
updates the same score), ``name``, ``value`` and ``dataType`` (``NUMERIC`` with the score, or
``CATEGORICAL`` with the label when a result has no score, as ``user_goal``), ``comment`` (the
explanation), ``metadata`` (label, turn, hook, and who judged: ``evaluator``,
``evaluator_version``, ``base_model``, ``adapter``, ``adapter_version``, ``rule``, ``threshold``,
those known), ``environment`` when configured, and the subject:
``traceId`` + ``observationId`` (Langfuse's ids for OpenTelemetry data are the hex trace and span
ids) when the conversation's events carried them, else ``sessionId`` = the conversation id.
Authentication is HTTP basic with the project's public key as user and secret key as password.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from typing import Any

import httpx

from sidecar.alerting.sinks._common import dump_json
from sidecar.alerting.sinks._http import HttpDestination
from sidecar.evaluations.config import LangfuseEvaluationsConfig
from sidecar.evaluations.metrics import EvaluationMetrics
from sidecar.evaluations.results import EvaluationResult
from sidecar.evaluations.sink import USER_AGENT, ResultsSink

SCORES_PATH = "/api/public/scores"


def score_body(result: EvaluationResult, environment: str | None = None) -> dict[str, Any]:
    """The JSON body of one score (see the module docstring)."""
    body: dict[str, Any] = {"id": result.record_id, "name": result.name}
    if result.score is not None:
        body.update(value=result.score, dataType="NUMERIC")
    else:
        body.update(value=result.label or "unknown", dataType="CATEGORICAL")
    if result.span is not None:
        body.update(traceId=result.span.trace_id, observationId=result.span.span_id)
    else:
        body["sessionId"] = result.conversation_id
    if result.explanation is not None:
        body["comment"] = result.explanation
    metadata: dict[str, Any] = {"turn": result.turn, "hook": result.hook, **result.provenance_metadata()}
    if result.label is not None:
        metadata["label"] = result.label
    if result.final:
        metadata["final"] = True
    body["metadata"] = metadata
    if environment:
        body["environment"] = environment
    return body


def basic_auth(cfg: LangfuseEvaluationsConfig) -> str:
    # The config requires both when the sink is enabled.
    assert cfg.public_key is not None
    assert cfg.secret_key is not None
    pair = f"{cfg.public_key.get_secret_value()}:{cfg.secret_key.get_secret_value()}"
    return "Basic " + base64.b64encode(pair.encode("utf-8")).decode("ascii")


class LangfuseScoresSink(ResultsSink):
    """POSTs each result of a batch as a Langfuse score, in order.

    A failure part-way retries the batch from the score that failed (the scores of this batch
    already accepted are remembered until it is done); a score sent twice all the same (after a
    restart) has the same ``id`` and Langfuse keeps one.
    """

    name = "langfuse"

    def __init__(
        self,
        cfg: LangfuseEvaluationsConfig,
        metrics: EvaluationMetrics,
        *,
        include_text: bool,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self._cfg = cfg
        self._http = HttpDestination(
            self.name,
            cfg.url.rstrip("/") + SCORES_PATH,
            timeout_seconds=cfg.delivery.timeout_seconds,
            headers={"user-agent": USER_AGENT, "content-type": "application/json", "authorization": basic_auth(cfg)},
            transport=transport,
        )
        super().__init__([self._http], cfg.delivery, metrics, include_text=include_text)
        self._batch: Sequence[EvaluationResult] | None = None
        self._accepted: set[str] = set()

    async def send(self, batch: Sequence[EvaluationResult]) -> None:
        if batch is not self._batch:  # a retry passes the same batch again; anything else is new
            self._batch = batch
            self._accepted.clear()
        for result in batch:
            if result.record_id in self._accepted:
                continue
            await self._http.post(dump_json(score_body(result, self._cfg.environment)), {})
            self._accepted.add(result.record_id)
        self._batch = None
        self._accepted.clear()
