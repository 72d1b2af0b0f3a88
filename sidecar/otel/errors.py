"""Why a span or a payload does not become events: data, never an exception that escapes a door."""

from __future__ import annotations

from typing import Final

from sidecar.errors import PermanentError

#: Every reason a refusal can carry (the ``reason`` label of ``sidecar_otel_refused_total``).
REASONS: Final = frozenset(
    {
        # the payload as a whole
        "empty",
        "oversized",
        "invalid_gzip",
        "invalid_protobuf",
        "invalid_json",
        "unsupported_content_type",
        "too_many_spans",
        "over_budget",
        "busy",
        "too_slow",
        # one span
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
)


class OtelRefused(PermanentError):
    """A payload or span that cannot become events; ``reason`` is one of :data:`REASONS`, ``detail``
    never quotes message text or attribute values."""

    def __init__(self, reason: str, detail: str) -> None:
        assert reason in REASONS, reason
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail
