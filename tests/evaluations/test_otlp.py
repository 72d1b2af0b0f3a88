"""The OTLP sink against a real OTLP/HTTP receiver run by the test: records decode as
``ExportLogsServiceRequest``, carry the evaluated span's ids, are batched, and survive failing
receivers (5xx, timeouts, 413) without loss; a refused record is counted, never retried forever."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from sidecar.alerting.config import RetryConfig
from sidecar.contract import Effect
from sidecar.evaluations.config import DeliveryConfig, OtlpEvaluationsConfig
from sidecar.evaluations.metrics import EvaluationMetrics
from sidecar.evaluations.otlp import EVENT_NAME, OtlpEvaluationsSink
from sidecar.events import SpanRef
from tests.evaluations.effects import SPAN, TRACE, all_kinds
from tests.evaluations.receivers import HANG, OtlpReceiver

FAST_RETRY = RetryConfig(initial_backoff_seconds=0.01, max_backoff_seconds=0.05)


def delivery(**over: Any) -> DeliveryConfig:
    base: dict[str, Any] = {"flush_seconds": 0.02, "timeout_seconds": 1.0, "retry": FAST_RETRY}
    return DeliveryConfig(**{**base, **over})


@pytest.fixture
async def receiver() -> AsyncIterator[OtlpReceiver]:
    r = OtlpReceiver()
    await r.start()
    yield r
    await r.stop()


async def make_sink(
    receiver: OtlpReceiver, registry: CollectorRegistry | None = None, **over: Any
) -> OtlpEvaluationsSink:
    cfg = OtlpEvaluationsConfig(
        enabled=True, endpoint=receiver.endpoint, delivery=delivery(**over), headers={"authorization": "Bearer t0k"}
    )
    sink = OtlpEvaluationsSink(cfg, EvaluationMetrics(registry or CollectorRegistry()), include_text=False)
    await sink.start()
    return sink


async def offer_all(sink: OtlpEvaluationsSink, effects: list[Effect]) -> None:
    waits = [w for w in (sink.offer(e) for e in effects) if w is not None]
    async with asyncio.timeout(10):
        await asyncio.gather(*waits)


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return registry.get_sample_value(name, labels) or 0.0


async def test_records_reach_the_receiver_parented_to_the_span(receiver: OtlpReceiver) -> None:
    sink = await make_sink(receiver)
    try:
        await offer_all(sink, all_kinds(span=SpanRef(TRACE, SPAN)) + all_kinds(cid="conv-2"))
    finally:
        await sink.stop()
    got = receiver.records()
    assert len(got) == 8
    assert len(receiver.requests) < 8  # batched
    assert receiver.requests[0][1]["Authorization"] == "Bearer t0k"
    parented = [r for r in got if r.trace_id]
    assert len(parented) == 4
    for r in parented:
        assert (r.trace_id, r.span_id) == (TRACE, SPAN)
        assert "gen_ai.conversation.id" not in r.attributes
    for r in got:
        assert r.event_name == EVENT_NAME and r.service_name == "llm-agent-sidecar"
        assert r.attributes["gen_ai.evaluation.name"] in {"goal_completion", "response_uncertainty", "user_goal"}
        if not r.trace_id:
            assert (r.span_id, r.attributes["gen_ai.conversation.id"]) == ("", "conv-2")
    completion = next(r for r in parented if r.attributes["sidecar.hook"] == "turn_closed")
    assert completion.attributes["gen_ai.evaluation.score.value"] == 0.2
    assert completion.attributes["gen_ai.evaluation.score.label"] == "incomplete"
    assert "P(end) 0.200" in completion.attributes["gen_ai.evaluation.explanation"]
    assert len({r.uid for r in got}) == 8


async def test_5xx_and_timeouts_are_retried_until_accepted(receiver: OtlpReceiver) -> None:
    registry = CollectorRegistry()
    receiver.plan.extend([500, 503, HANG, 429])
    sink = await make_sink(receiver, registry, timeout_seconds=0.3)
    try:
        await offer_all(sink, all_kinds(span=SpanRef(TRACE, SPAN)))
    finally:
        await sink.stop()
    assert receiver.answers[:3] == [500, 503, 429]  # the hung request never answered
    assert len(receiver.records()) == 4
    assert sample(registry, "sidecar_evaluation_results_delivered_total", sink="otlp") == 4
    assert sample(registry, "sidecar_evaluation_delivery_retries_total", sink="otlp", reason="http_500") == 1
    assert sample(registry, "sidecar_evaluation_delivery_retries_total", sink="otlp", reason="timeout") == 1


async def test_413_splits_the_batch_and_drops_only_what_never_fits(receiver: OtlpReceiver) -> None:
    registry = CollectorRegistry()
    sink = await make_sink(receiver, registry, flush_seconds=0.2)
    one = len(receiver_body_of_one(sink))
    receiver.max_body_bytes = one * 2 + 50  # two records fit, three do not
    effects = [e for i in range(4) for e in all_kinds(cid=f"c{i}")]
    try:
        await offer_all(sink, effects)
    finally:
        await sink.stop()
    assert 413 in receiver.answers
    got = receiver.records()
    assert len(got) == 16 and len({r.uid for r in got}) == 16
    assert sample(registry, "sidecar_evaluation_results_failed_total", sink="otlp", reason="http_413") == 0


def receiver_body_of_one(sink: OtlpEvaluationsSink) -> bytes:
    from sidecar.evaluations.otlp import export_request
    from sidecar.evaluations.results import evaluation_results

    return export_request(evaluation_results(all_kinds(cid="c0")[1]), "llm-agent-sidecar", 0.0).SerializeToString()


async def test_a_refused_batch_is_counted_and_the_effect_goes_on(receiver: OtlpReceiver) -> None:
    registry = CollectorRegistry()
    receiver.plan.extend([400])
    sink = await make_sink(receiver, registry)
    try:
        await offer_all(sink, all_kinds()[:1])
        await offer_all(sink, all_kinds()[1:2])
    finally:
        await sink.stop()
    assert sample(registry, "sidecar_evaluation_results_failed_total", sink="otlp", reason="http_400") == 1
    assert len(receiver.records()) == 1


async def test_while_the_receiver_is_down_effects_wait_and_the_queue_is_bounded(receiver: OtlpReceiver) -> None:
    registry = CollectorRegistry()
    receiver.plan.extend([503] * 10_000)
    sink = await make_sink(receiver, registry, max_queue_records=3, max_batch_records=2)
    effects = [e for i in range(5) for e in all_kinds(cid=f"c{i}")]
    waits = [asyncio.ensure_future(w) for w in (sink.offer(e) for e in effects) if w is not None]
    try:
        await asyncio.sleep(0.3)
        assert not any(w.done() for w in waits)  # pinned: nothing accepted
        assert sink.delivery.queued <= 3
        assert sample(registry, "sidecar_evaluation_queue_records", sink="otlp") <= 3
        assert not sink.health().ready
        assert sample(registry, "sidecar_evaluation_sink_up", sink="otlp") == 0
        receiver.plan.clear()  # the receiver is back
        async with asyncio.timeout(10):
            await asyncio.gather(*waits)
    finally:
        await sink.stop()
    assert len({r.uid for r in receiver.records()}) == 20
    assert sink.health().ready is False  # stopped
