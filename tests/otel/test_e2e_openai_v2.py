"""Tool calls through a real instrumentation: an agent using the ``openai`` client, instrumented
with ``opentelemetry-instrumentation-openai-v2``, exporting with the OTel SDK's OTLP/HTTP exporter
to the receiver. The model is a small fake OpenAI server that answers with a tool call: the suite's
vLLM model (random weights) cannot be made to call a tool, and the tool-call attributes the
instrumentation writes are the point here. The events equal a native producer's, in each content
mode: ``SPAN_ONLY`` (content on the span), ``EVENT_ONLY`` (content only as log records, exported with
the SDK's OTLP/HTTP log exporter to ``/v1/logs``) and ``SPAN_AND_EVENT`` (both). The same agent
against vLLM, with all three instrumentations, is ``test_e2e_instrumentations.py``."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from sidecar.otel.config import OtelConfig, OtlpReceiverConfig
from sidecar.otel.ingest import OtelIngest
from sidecar.otel.metrics import OtelMetrics
from sidecar.otel.receiver import OtlpHttpReceiver
from tests.otel.booking import AGENT, CONVERSATION, fake_openai_server, native_messages, run_booking_agent
from tests.otel.spans import decoded, dedup, native_events
from tests.otel.test_receiver import RecordingProducer

pytest.importorskip("openai")
pytest.importorskip("opentelemetry.instrumentation.openai_v2")


@pytest.mark.parametrize("mode", ["SPAN_ONLY", "EVENT_ONLY", "SPAN_AND_EVENT"])
async def test_openai_v2_spans_become_the_native_events(monkeypatch: pytest.MonkeyPatch, mode: str) -> None:
    from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    registry = CollectorRegistry()
    metrics = OtelMetrics(registry)
    producer = RecordingProducer()
    receiver = OtlpHttpReceiver(
        OtlpReceiverConfig(enabled=True, host="127.0.0.1", port=0, allow_unauthenticated=True),
        OtelIngest(OtelConfig(), metrics, max_event_bytes=1 << 20),
        producer,  # type: ignore[arg-type]
        metrics,
        events_topic="events",
    )
    await receiver.start()
    try:
        async with fake_openai_server() as base_url:
            messages = await run_booking_agent(
                base_url,
                mode,
                monkeypatch,
                OTLPSpanExporter(endpoint=f"http://127.0.0.1:{receiver.port}/v1/traces"),
                OTLPLogExporter(endpoint=f"http://127.0.0.1:{receiver.port}/v1/logs"),
            )
    finally:
        await receiver.stop()

    logs = dedup(decoded(producer.acked))
    assert list(logs) == [CONVERSATION]
    native = native_events(CONVERSATION, native_messages(messages))
    assert [e.message for e in logs[CONVERSATION]] == [e.message for e in native]
    assert {e.agent for e in logs[CONVERSATION]} == {AGENT}
    # nothing refused, nothing waited in vain (in EVENT_ONLY the spans carry no content: every
    # message came from the log records)
    assert (
        registry.get_sample_value(
            "sidecar_otel_refused_total", {"door": "receiver", "reason": "content_missing_capture_off"}
        )
        is None
    )
    assert registry.get_sample_value("sidecar_otel_holds_total", {"wait": "logs", "outcome": "expired"}) is None
