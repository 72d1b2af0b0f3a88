"""Request shapes of the Langfuse and Phoenix public APIs, written down from their documentation
as JSON Schemas, so the sinks' bodies are checked against what the services document, not against
the sinks' own idea of it.

* Langfuse ``POST /api/public/scores``: ``ScoreBody`` of the public OpenAPI spec
  (https://cloud.langfuse.com/generated/api/openapi.yml; "Scores via API/SDK" in the docs): ``name``
  and ``value`` required, ``value`` a number or a string, ``dataType`` NUMERIC | CATEGORICAL |
  BOOLEAN | TEXT, ``id`` the idempotency key; trace, observation, session or dataset-run subject.
* Phoenix ``POST /v1/span_annotations`` and ``/v1/session_annotations``
  (https://arize.com/docs/phoenix, REST API v1, ``SpanAnnotationData`` / ``SessionAnnotationData``):
  ``{"data": [...]}``; each with ``name``, ``annotator_kind`` LLM | CODE | HUMAN, optional
  ``result`` {label, score, explanation}, ``metadata``, ``identifier`` (upsert key) and the subject
  ``span_id`` (hex, no 0x) or ``session_id``.
"""

from __future__ import annotations

from typing import Any

LANGFUSE_SCORE: dict[str, Any] = {
    "type": "object",
    "required": ["name", "value"],
    "additionalProperties": False,
    "properties": {
        "id": {"type": "string"},
        "traceId": {"type": "string"},
        "sessionId": {"type": "string"},
        "observationId": {"type": "string"},
        "datasetRunId": {"type": "string"},
        "name": {"type": "string"},
        "value": {"type": ["number", "string"]},
        "comment": {"type": "string"},
        "metadata": {"type": "object"},
        "environment": {"type": "string"},
        "queueId": {"type": "string"},
        "dataType": {"enum": ["NUMERIC", "BOOLEAN", "CATEGORICAL", "TEXT"]},
        "configId": {"type": "string"},
    },
    "allOf": [
        {
            "if": {"properties": {"dataType": {"const": "NUMERIC"}}, "required": ["dataType"]},
            "then": {"properties": {"value": {"type": "number"}}},
        },
        {
            "if": {"properties": {"dataType": {"const": "CATEGORICAL"}}, "required": ["dataType"]},
            "then": {"properties": {"value": {"type": "string"}}},
        },
        {"if": {"required": ["observationId"]}, "then": {"required": ["traceId"]}},
    ],
}

_RESULT = {
    "type": ["object", "null"],
    "additionalProperties": False,
    "properties": {
        "label": {"type": ["string", "null"]},
        "score": {"type": ["number", "null"]},
        "explanation": {"type": ["string", "null"]},
    },
}


def _annotation(subject: str, pattern: str | None = None) -> dict[str, Any]:
    subject_schema: dict[str, Any] = {"type": "string", "minLength": 1}
    if pattern:
        subject_schema["pattern"] = pattern
    return {
        "type": "object",
        "required": ["name", "annotator_kind", subject],
        "additionalProperties": False,
        "properties": {
            subject: subject_schema,
            "name": {"type": "string"},
            "annotator_kind": {"enum": ["LLM", "CODE", "HUMAN"]},
            "result": _RESULT,
            "metadata": {"type": ["object", "null"]},
            "identifier": {"type": "string"},
        },
    }


def _request(item: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "required": ["data"],
        "additionalProperties": False,
        "properties": {"data": {"type": "array", "items": item}},
    }


PHOENIX_SPAN_ANNOTATIONS = _request(_annotation("span_id", "^[0-9a-f]{16}$"))
PHOENIX_SESSION_ANNOTATIONS = _request(_annotation("session_id"))

# The documentation's own example of a span annotation (Phoenix "Capture feedback"): the schema
# above must accept it, or it was written down wrong.
PHOENIX_DOC_EXAMPLE = {
    "data": [
        {
            "span_id": "67f6740bbe1ddc3f",
            "name": "correctness",
            "annotator_kind": "HUMAN",
            "result": {"label": "correct", "score": 0.85, "explanation": "The response answered the question I asked"},
            "metadata": {"model": "gpt-4", "threshold_ms": 500, "confidence": "high"},
            "identifier": "user-123",
        }
    ]
}
LANGFUSE_DOC_EXAMPLE = {
    "id": "unique-id",
    "traceId": "trace-id-123",
    "observationId": "generation-id-456",
    "name": "quality",
    "value": 0.8,
    "dataType": "NUMERIC",
    "comment": "High accuracy score",
}
