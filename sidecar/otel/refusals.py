"""Refusals a user can read: per reason, what to change, in words.

The same text goes three ways: a log line per reason (at most one per :data:`LOG_INTERVAL_SECONDS`,
with the count since the last one), the OTLP ``partial_success.error_message`` of the receiver's
answer, and the docs' table (docs/opentelemetry.md, "Refusals"). The ``reason`` label of
``sidecar_otel_refused_total`` is the key. A fix never quotes the span's content.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Final

import structlog

from sidecar.otel.errors import REASONS

log = structlog.get_logger(__name__)

LOG_INTERVAL_SECONDS: Final = 60.0

#: What to do about each span refusal (payload refusals are answered with an HTTP status and text).
FIXES: Final[Mapping[str, str]] = {
    "content_missing_capture_off": (
        "the model call carries no message content, and no GenAI log records came: turn content capture on in "
        "the app "
        "(OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=SPAN_ONLY or SPAN_AND_EVENT for "
        "opentelemetry-instrumentation-openai-v2 with OTEL_SEMCONV_STABILITY_OPT_IN=gen_ai_latest_experimental; "
        "TRACELOOP_TRACE_CONTENT=true for OpenLLMetry; OpenInference captures by default); in EVENT_ONLY mode, "
        "export the app's logs to /v1/logs"
    ),
    "content_on_logs_not_received": (
        "the model call carries no message content and its content did not come as OTLP log records within "
        "otel.hold.logs_seconds, though the app sends such records for other calls: export the app's logs to the "
        "receiver's /v1/logs (OTEL_EXPORTER_OTLP_LOGS_ENDPOINT, with a LoggerProvider set up), or put content on "
        "the span (OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=SPAN_ONLY or SPAN_AND_EVENT)"
    ),
    "content_by_reference": (
        "the content was uploaded elsewhere (gen_ai.input.messages_ref, gen_ai.output.messages_ref) and only a "
        "reference was sent, which the sidecar does not follow: turn the upload hook off "
        "(OTEL_INSTRUMENTATION_GENAI_COMPLETION_HOOK unset) so content travels on the span or its log records"
    ),
    "log_without_span": (
        "a GenAI content log record without a valid trace and span id: emit it inside the model call's span "
        "context (the instrumentations do)"
    ),
    "content_empty": "the model call's history is empty: nothing to derive",
    "no_conversation_id": (
        "no gen_ai.conversation.id (or session.id) on the span, its ancestors or its trace within "
        "otel.hold.parent_seconds: set it on the app's parent span, or on every span (baggage with the "
        "BaggageSpanProcessor), and export the parent within the wait"
    ),
    "invalid_conversation_id": "the conversation id is empty, too long or holds control characters",
    "oversized_attribute": "a message attribute is over otel.limits.max_attribute_bytes",
    "too_deep": "a message attribute's JSON is deeper than otel.limits.max_json_depth",
    "too_many_messages": "the span's history is longer than otel.limits.max_messages_per_span",
    "malformed_messages": "the message attributes do not follow the dialect they claim",
    "contract_violation": "a derived event does not fit the event contract (see docs/event-contract.md)",
}


def explain(reasons: Mapping[str, int]) -> str:
    """``partial_success.error_message``: the counts, then each reason's fix."""
    counts = ", ".join(f"{reason}={n}" for reason, n in sorted(reasons.items()))
    fixes = " ".join(f"{reason}: {FIXES[reason]}." for reason in sorted(reasons) if reason in FIXES)
    return f"refused spans: {counts}." + (f" {fixes}" if fixes else "")


class RefusalLog:
    """One ``otel.refused`` warning per reason at most every ``interval_seconds``."""

    def __init__(self, interval_seconds: float = LOG_INTERVAL_SECONDS, clock: Callable[[], float] = time.monotonic):
        self._interval = interval_seconds
        self._clock = clock
        self._last: dict[str, float] = {}
        self._since: dict[str, int] = {}

    def note(self, door: str, reason: str, n: int) -> None:
        if reason not in REASONS:  # closed set: never a value from the input
            return
        self._since[reason] = self._since.get(reason, 0) + n
        now = self._clock()
        last = self._last.get(reason)
        if last is not None and now - last < self._interval:
            return
        self._last[reason] = now
        count = self._since.pop(reason)
        log.warning("otel.refused", door=door, reason=reason, spans=count, fix=FIXES.get(reason, "see docs"))
