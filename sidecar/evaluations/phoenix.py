"""Phoenix annotations: ``POST {url}/v1/span_annotations`` and ``/v1/session_annotations``.

Shape (Phoenix REST API v1): ``{"data": [annotation, ...]}``, each annotation with ``name``,
``annotator_kind`` (``CODE``: the verdicts come from a model the sidecar runs, not from an LLM
judge), ``result`` (``label``, ``score``, ``explanation``, those it has), ``metadata`` (turn, hook,
and who judged: ``evaluator``, ``evaluator_version``, ``base_model``, ``adapter``,
``adapter_version``, ``rule``, ``threshold``, those known)
and ``identifier`` (the result's stable id: Phoenix upserts on it, so a re-sent annotation
replaces itself), plus the subject: ``span_id`` (hex) when the conversation's events carried
OpenTelemetry ids, else ``session_id`` = the conversation id on the session endpoint. With an API
key, requests carry it as a bearer token.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import httpx

from sidecar.alerting.sinks._common import dump_json
from sidecar.alerting.sinks._http import HttpDestination
from sidecar.evaluations.config import PhoenixEvaluationsConfig
from sidecar.evaluations.metrics import EvaluationMetrics
from sidecar.evaluations.results import EvaluationResult
from sidecar.evaluations.sink import USER_AGENT, ResultsSink

SPAN_PATH = "/v1/span_annotations"
SESSION_PATH = "/v1/session_annotations"
ANNOTATOR_KIND = "CODE"


def annotation(result: EvaluationResult) -> dict[str, Any]:
    """One annotation (see the module docstring); its subject decides the endpoint."""
    outcome: dict[str, Any] = {}
    if result.label is not None:
        outcome["label"] = result.label
    if result.score is not None:
        outcome["score"] = result.score
    if result.explanation is not None:
        outcome["explanation"] = result.explanation
    metadata: dict[str, Any] = {"turn": result.turn, "hook": result.hook, **result.provenance_metadata()}
    if result.final:
        metadata["final"] = True
    body: dict[str, Any] = {
        "name": result.name,
        "annotator_kind": ANNOTATOR_KIND,
        "result": outcome,
        "metadata": metadata,
        "identifier": result.record_id,
    }
    if result.span is not None:
        body["span_id"] = result.span.span_id
    else:
        body["session_id"] = result.conversation_id
    return body


class PhoenixAnnotationsSink(ResultsSink):
    """POSTs a batch as at most two requests: span annotations, then session annotations.

    A failure of the second retries both: the first's annotations are upserted, not doubled.
    """

    name = "phoenix"

    def __init__(
        self,
        cfg: PhoenixEvaluationsConfig,
        metrics: EvaluationMetrics,
        *,
        include_text: bool,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        headers = {"user-agent": USER_AGENT, "content-type": "application/json"}
        if cfg.api_key is not None:
            headers["authorization"] = f"Bearer {cfg.api_key.get_secret_value()}"
        root = cfg.url.rstrip("/")
        timeout = cfg.delivery.timeout_seconds
        self._spans = HttpDestination(
            self.name, root + SPAN_PATH, timeout_seconds=timeout, headers=headers, transport=transport
        )
        self._sessions = HttpDestination(
            self.name, root + SESSION_PATH, timeout_seconds=timeout, headers=headers, transport=transport
        )
        super().__init__([self._spans, self._sessions], cfg.delivery, metrics, include_text=include_text)

    async def send(self, batch: Sequence[EvaluationResult]) -> None:
        spans = [annotation(r) for r in batch if r.span is not None]
        sessions = [annotation(r) for r in batch if r.span is None]
        if spans:
            await self._spans.post(dump_json({"data": spans}), {})
        if sessions:
            await self._sessions.post(dump_json({"data": sessions}), {})
