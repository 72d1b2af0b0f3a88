"""Refusals a user can read: one reason per cause, each with its fix, logged at most once a minute
per reason (with the count since the last line), and the same text in partial_success."""

from __future__ import annotations

import structlog
from prometheus_client import CollectorRegistry

from sidecar.otel.config import OtelConfig
from sidecar.otel.errors import REASONS
from sidecar.otel.ingest import OtelIngest
from sidecar.otel.metrics import OtelMetrics
from sidecar.otel.refusals import FIXES, RefusalLog, explain
from tests.otel.spans import make_span, traces
from tests.otel.test_backlog import Clock


def test_every_span_reason_has_a_fix_and_the_fixes_name_only_known_reasons() -> None:
    span_reasons = {
        "content_missing_capture_off",
        "content_on_logs_not_received",
        "content_by_reference",
        "log_without_span",
        "content_empty",
        "no_conversation_id",
        "invalid_conversation_id",
        "oversized_attribute",
        "too_deep",
        "too_many_messages",
        "malformed_messages",
        "contract_violation",
    }
    assert span_reasons <= REASONS
    assert set(FIXES) == span_reasons


def test_capture_off_and_a_missing_id_are_told_apart_with_their_fixes() -> None:
    text = explain({"no_conversation_id": 2, "content_missing_capture_off": 1})
    assert text.startswith("refused spans: content_missing_capture_off=1, no_conversation_id=2.")
    assert "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT" in text
    assert "otel.hold.parent_seconds" in text
    # a reason without a fix (a payload's) is counted, not explained
    assert explain({"busy": 1}) == "refused spans: busy=1."


def test_one_log_line_per_reason_per_interval_with_the_count_since() -> None:
    clock = Clock()
    refusals = RefusalLog(60.0, clock)
    with structlog.testing.capture_logs() as logs:
        refusals.note("receiver", "content_missing_capture_off", 3)
        refusals.note("receiver", "content_missing_capture_off", 4)
        refusals.note("receiver", "no_conversation_id", 1)
        clock.now += 61
        refusals.note("bridge", "content_missing_capture_off", 1)
        refusals.note("receiver", "not-a-reason\nforged", 1)
    lines = [(e["reason"], e["spans"]) for e in logs if e["event"] == "otel.refused"]
    assert lines == [("content_missing_capture_off", 3), ("no_conversation_id", 1), ("content_missing_capture_off", 5)]
    assert all(e["fix"] == FIXES[e["reason"]] for e in logs)


def test_the_ingest_logs_its_refusals(registry: CollectorRegistry) -> None:
    ingest = OtelIngest(OtelConfig(hold={"logs_seconds": 0}), OtelMetrics(registry), max_event_bytes=1 << 20)
    capture_off = make_span({"gen_ai.operation.name": "chat", "gen_ai.conversation.id": "c"})
    with structlog.testing.capture_logs() as logs:
        ingest.derive(traces([capture_off]), "receiver")
    assert [(e["event"], e["reason"]) for e in logs] == [("otel.refused", "content_missing_capture_off")]
