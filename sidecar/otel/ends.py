"""End-of-conversation signals in spans (``otel.conversation_end``).

A span ends its conversation when it matches one of the configured markers (the agent's own end
marker: a span name, an attribute, or both) or, when the operator says so, when it is an
``invoke_agent`` span at the root of its trace. The door then derives a ``conversation_end`` event
that takes the next index of the conversation's log (see :meth:`HistoryTracker.end
<sidecar.otel.history.HistoryTracker.end>`), with an id that is a function of (conversation, that
index) only, so a re-read marker yields the same event.
"""

from __future__ import annotations

import hashlib

from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from sidecar.otel.config import EndMarkerConfig, OtelConversationEndConfig
from sidecar.otel.dialects import Attributes, string_attr

#: What stands for the message content in an end event's id (messages hash their canonical form).
END_DIGEST = hashlib.blake2b(b"conversation_end", digest_size=16).digest()
_FALSE = frozenset({"", "false", "0"})


def attribute_text(value: AnyValue) -> str | None:
    """A scalar attribute as text (``true``/``false`` for booleans); ``None`` for arrays, maps, bytes."""
    kind = value.WhichOneof("value")
    if kind == "string_value":
        return value.string_value
    if kind == "bool_value":
        return "true" if value.bool_value else "false"
    if kind == "int_value":
        return str(value.int_value)
    if kind == "double_value":
        return repr(value.double_value)
    return None


def _is_root(span: Span) -> bool:
    return not span.parent_span_id.strip(b"\x00")


class EndSignals:
    """Which spans end their conversation; stateless, cheap for spans that match nothing."""

    def __init__(self, config: OtelConversationEndConfig) -> None:
        self._markers = config.markers
        self._root_agent_span = config.root_agent_span
        self.enabled = config.enabled

    def matches(self, span: Span, attrs: Attributes) -> bool:
        if not self.enabled:
            return False
        if self._root_agent_span and _is_root(span) and string_attr(attrs, "gen_ai.operation.name") == "invoke_agent":
            return True
        return any(_marker_matches(m, span, attrs) for m in self._markers)


def _marker_matches(marker: EndMarkerConfig, span: Span, attrs: Attributes) -> bool:
    if marker.span_name is not None and span.name != marker.span_name:
        return False
    if marker.attribute is None:
        return True
    value = attrs.get(marker.attribute)
    if value is None:
        return False
    text = attribute_text(value)
    if text is None:
        return False
    if marker.value is not None:
        return text == marker.value
    return text.strip().lower() not in _FALSE
