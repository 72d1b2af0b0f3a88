"""The Langfuse-scores and Phoenix-annotations sinks against the request shapes their public API
documentation gives (``api_shapes``), over real HTTP to a recording receiver; ids are idempotent."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator
from typing import Any

import jsonschema
import pytest
from prometheus_client import CollectorRegistry

from sidecar.alerting.config import RetryConfig
from sidecar.evaluations.config import DeliveryConfig, LangfuseEvaluationsConfig, PhoenixEvaluationsConfig
from sidecar.evaluations.langfuse import LangfuseScoresSink
from sidecar.evaluations.metrics import EvaluationMetrics
from sidecar.evaluations.phoenix import PhoenixAnnotationsSink
from sidecar.evaluations.results import results_of
from sidecar.evaluations.sink import ResultsSink
from sidecar.events import SpanRef
from tests.evaluations.api_shapes import (
    LANGFUSE_DOC_EXAMPLE,
    LANGFUSE_SCORE,
    PHOENIX_DOC_EXAMPLE,
    PHOENIX_SESSION_ANNOTATIONS,
    PHOENIX_SPAN_ANNOTATIONS,
)
from tests.evaluations.effects import SPAN, TRACE, all_kinds
from tests.evaluations.receivers import Receiver, json_bodies

DELIVERY = DeliveryConfig(
    flush_seconds=0.02, timeout_seconds=1.0, retry=RetryConfig(initial_backoff_seconds=0.01, max_backoff_seconds=0.05)
)


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    r = Receiver(path="/")
    await r.start()
    yield r
    await r.stop()


async def run(sink: ResultsSink, *, twice: bool = False) -> None:
    effects = all_kinds(span=SpanRef(TRACE, SPAN)) + all_kinds(cid="conv-2")
    await sink.start()
    try:
        for _ in range(2 if twice else 1):
            async with asyncio.timeout(10):
                await asyncio.gather(*[w for w in (sink.offer(e) for e in effects) if w is not None])
    finally:
        await sink.stop()


def test_the_written_down_shapes_accept_the_documentations_examples() -> None:
    jsonschema.validate(PHOENIX_DOC_EXAMPLE, PHOENIX_SPAN_ANNOTATIONS)
    jsonschema.validate(LANGFUSE_DOC_EXAMPLE, LANGFUSE_SCORE)


async def test_langfuse_scores(receiver: Receiver) -> None:
    cfg = LangfuseEvaluationsConfig(
        enabled=True,
        url=receiver.url + "/",
        public_key="pk-lf-1",
        secret_key="sk-lf-2",
        environment="production",
        delivery=DELIVERY,
    )
    await run(LangfuseScoresSink(cfg, EvaluationMetrics(CollectorRegistry()), include_text=False))
    sent = json_bodies(receiver)
    assert len(sent) == 8 and {p for p, _, _ in sent} == {"/api/public/scores"}
    auth = "Basic " + base64.b64encode(b"pk-lf-1:sk-lf-2").decode()
    for _, headers, body in sent:
        jsonschema.validate(body, LANGFUSE_SCORE)
        assert headers["Authorization"] == auth and headers["Content-Type"] == "application/json"
        assert body["environment"] == "production"
    by_id = {b["id"]: b for _, _, b in sent}
    assert set(by_id) == {r.record_id for r in results_of(all_kinds() + all_kinds(cid="conv-2"))}
    spanned = [b for _, _, b in sent if "traceId" in b]
    assert len(spanned) == 4
    assert all((b["traceId"], b["observationId"]) == (TRACE, SPAN) and "sessionId" not in b for b in spanned)
    assert all(b["sessionId"] == "conv-2" for _, _, b in sent if "traceId" not in b)
    goal = next(b for _, _, b in sent if b["name"] == "user_goal")
    assert (goal["dataType"], goal["value"]) == ("CATEGORICAL", "g3")
    done = next(b for _, _, b in sent if b["name"] == "goal_completion" and b["metadata"].get("final"))
    assert (done["dataType"], done["value"], done["metadata"]["label"]) == ("NUMERIC", 0.9, "complete")


async def test_phoenix_annotations(receiver: Receiver) -> None:
    cfg = PhoenixEvaluationsConfig(enabled=True, url=receiver.url, api_key="px-key", delivery=DELIVERY)
    await run(PhoenixAnnotationsSink(cfg, EvaluationMetrics(CollectorRegistry()), include_text=False), twice=True)
    sent = json_bodies(receiver)
    spans = [b for p, _, b in sent if p == "/v1/span_annotations"]
    sessions = [b for p, _, b in sent if p == "/v1/session_annotations"]
    assert spans and sessions and len(spans) + len(sessions) == len(sent)
    for body in spans:
        jsonschema.validate(body, PHOENIX_SPAN_ANNOTATIONS)
    for body in sessions:
        jsonschema.validate(body, PHOENIX_SESSION_ANNOTATIONS)
    assert all(h["Authorization"] == "Bearer px-key" for _, h, _ in sent)
    items = [a for b in spans + sessions for a in b["data"]]
    # Sent twice (a restart re-sending the same effects): the same identifiers, upserted by Phoenix.
    assert len(items) == 16
    unique: dict[str, Any] = {}
    for a in items:
        assert unique.setdefault(a["identifier"], a) == a
    assert len(unique) == 8
    assert all(a["span_id"] == SPAN for b in spans for a in b["data"])
    assert all(a["session_id"] == "conv-2" for b in sessions for a in b["data"])
    unc = next(a for a in items if a["name"] == "response_uncertainty")
    assert unc["annotator_kind"] == "CODE" and unc["result"]["label"] == "branching"


async def test_langfuse_failures_retry_the_batch_and_rejections_are_counted(receiver: Receiver) -> None:
    registry = CollectorRegistry()
    receiver.plan.extend([502, 401])
    cfg = LangfuseEvaluationsConfig(
        enabled=True,
        url=receiver.url,
        public_key="pk",
        secret_key="sk",
        delivery=DELIVERY.model_copy(update={"max_batch_records": 1}),
    )
    await run(LangfuseScoresSink(cfg, EvaluationMetrics(registry), include_text=False))
    assert receiver.answers[:2] == [502, 401]
    assert (
        registry.get_sample_value("sidecar_evaluation_results_failed_total", {"sink": "langfuse", "reason": "http_401"})
        == 1
    )
    assert len(json_bodies(receiver)) == 7


async def test_langfuse_retry_resumes_at_the_failed_score(receiver: Receiver) -> None:
    cfg = LangfuseEvaluationsConfig(
        enabled=True,
        url=receiver.url,
        public_key="pk",
        secret_key="sk",
        delivery=DELIVERY.model_copy(update={"flush_seconds": 0.3}),
    )
    receiver.plan.extend([200, 200, 503])
    await run(LangfuseScoresSink(cfg, EvaluationMetrics(CollectorRegistry()), include_text=False))
    ids = [b["id"] for _, _, b in json_bodies(receiver)]
    assert receiver.answers[:3] == [200, 200, 503]
    assert len(ids) == 8 and len(set(ids)) == 8  # the two accepted before the 503 were not sent again
