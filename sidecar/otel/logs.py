"""GenAI content sent as OTLP log records (the Events API), joined to its span by trace and span id.

Instrumentations in event mode (``opentelemetry-instrumentation-openai-v2`` with
``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=EVENT_ONLY`` or ``SPAN_AND_EVENT``) leave the
span without content and emit it as log records in the span's context. The records read are the
GenAI conventions' content events, by the record's ``event_name`` (or its ``event.name``
attribute, as older SDKs wrote it):

* ``gen_ai.client.inference.operation.details`` (current conventions): ``gen_ai.input.messages``,
  ``gen_ai.output.messages`` and ``gen_ai.system_instructions`` as attributes;
* ``gen_ai.system.message``, ``gen_ai.user.message``, ``gen_ai.assistant.message``,
  ``gen_ai.tool.message`` and ``gen_ai.choice`` (conventions v1.27 to v1.36): one record per
  message, the message in the record's body (a map) or attributes.

Each becomes the span event it would have been on the span (the body's fields as the event's
attributes), so :mod:`sidecar.otel.span_events` reads both the same way. Content uploaded by
reference (``gen_ai.input.messages_ref``, ``gen_ai.output.messages_ref``: the upload hook of
``opentelemetry-util-genai``) cannot be read here and is refused as ``content_by_reference``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

from opentelemetry.proto.common.v1.common_pb2 import KeyValue
from opentelemetry.proto.logs.v1.logs_pb2 import LogRecord, LogsData
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from sidecar.otel.dialects import GENAI_INPUT, GENAI_OUTPUT
from sidecar.otel.span_events import DETAILS, MESSAGE_EVENTS

#: Attributes that point at content uploaded elsewhere instead of carrying it.
REFERENCES: Final = (GENAI_INPUT + "_ref", GENAI_OUTPUT + "_ref", "gen_ai.system_instructions_ref")
_READ: Final = frozenset({DETAILS, *MESSAGE_EVENTS})

SpanKey = tuple[bytes, bytes]


@dataclass(slots=True)
class LogContent:
    """What a logs payload holds: content events per span, and the count of the rest."""

    events: dict[SpanKey, list[Span.Event]] = field(default_factory=dict)
    refused: Counter[str] = field(default_factory=Counter)
    ignored: int = 0


def event_name(record: LogRecord) -> str:
    if record.event_name:
        return record.event_name
    for kv in record.attributes:
        if kv.key == "event.name" and kv.value.WhichOneof("value") == "string_value":
            return kv.value.string_value
    return ""


def has_reference(attrs: Mapping[str, object]) -> bool:
    return any(key in attrs for key in REFERENCES)


def read_logs(data: LogsData, found: LogContent | None = None) -> LogContent:
    """The GenAI content events of a payload by (trace id, span id), added to ``found``."""
    found = found if found is not None else LogContent()
    for rl in data.resource_logs:
        for sl in rl.scope_logs:
            for record in sl.log_records:
                name = event_name(record)
                if name not in _READ:
                    found.ignored += 1
                    continue
                attrs = {kv.key: kv.value for kv in record.attributes}
                if name == DETAILS and has_reference(attrs) and GENAI_INPUT not in attrs and GENAI_OUTPUT not in attrs:
                    found.refused["content_by_reference"] += 1
                    continue
                if len(record.trace_id) != 16 or len(record.span_id) != 8 or not record.span_id.strip(b"\x00"):
                    found.refused["log_without_span"] += 1
                    continue
                event = Span.Event(name=name, time_unix_nano=record.time_unix_nano or record.observed_time_unix_nano)
                event.attributes.extend(kv for kv in record.attributes if kv.key != "event.name")
                if record.body.WhichOneof("value") == "kvlist_value":
                    event.attributes.extend(
                        KeyValue(key=kv.key, value=kv.value) for kv in record.body.kvlist_value.values
                    )
                found.events.setdefault((record.trace_id, record.span_id), []).append(event)
    return found
