"""``gen_ai.evaluation.result`` log records over OTLP/HTTP (protobuf), per the GenAI conventions.

Each result is one ``LogRecord`` with ``event_name = "gen_ai.evaluation.result"`` and the
attributes ``gen_ai.evaluation.name``, ``gen_ai.evaluation.score.value``,
``gen_ai.evaluation.score.label`` and ``gen_ai.evaluation.explanation`` (those it has). It is
parented to the evaluated span (the record's ``trace_id`` and ``span_id``) when the conversation's
events carried OpenTelemetry ids; otherwise it carries ``gen_ai.conversation.id``. Every record
also carries ``log.record.uid`` (the result's stable id: a re-sent record is a duplicate a backend
may drop), ``gen_ai.agent.name`` when the conversation has one, and ``sidecar.turn``,
``sidecar.hook`` and, on the conversation's final completion verdict, ``sidecar.final``.

Who judged: ``gen_ai.evaluation.evaluator.id`` (``llm-agent-sidecar``) and
``gen_ai.evaluation.evaluator.version`` (the package version), from the open proposal for
evaluator provenance in the GenAI conventions, on every record; and where the conventions have no
name, ``sidecar.base_model``, ``sidecar.adapter``, ``sidecar.adapter.version``, ``sidecar.rule``
and ``sidecar.threshold`` (those known; none on ``user_goal``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import httpx
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, InstrumentationScope, KeyValue
from opentelemetry.proto.logs.v1.logs_pb2 import LogRecord, ResourceLogs, ScopeLogs, SeverityNumber
from opentelemetry.proto.resource.v1.resource_pb2 import Resource

from sidecar.alerting.sinks._http import HttpDestination
from sidecar.evaluations.config import OtlpEvaluationsConfig
from sidecar.evaluations.metrics import EvaluationMetrics
from sidecar.evaluations.results import EvaluationResult
from sidecar.evaluations.sink import USER_AGENT, ResultsSink
from sidecar.provenance import EVALUATOR_NAME, evaluator_version

EVENT_NAME = "gen_ai.evaluation.result"
# The open proposal for evaluator provenance in the GenAI conventions
# (open-telemetry/semantic-conventions-genai pull request 359): development status, may change.
EVALUATOR_ID = "gen_ai.evaluation.evaluator.id"
EVALUATOR_VERSION = "gen_ai.evaluation.evaluator.version"
SCOPE_NAME = "sidecar.evaluations"


def _kv(key: str, value: str | float | int | bool) -> KeyValue:
    if isinstance(value, bool):
        return KeyValue(key=key, value=AnyValue(bool_value=value))
    if isinstance(value, int):
        return KeyValue(key=key, value=AnyValue(int_value=value))
    if isinstance(value, float):
        return KeyValue(key=key, value=AnyValue(double_value=value))
    return KeyValue(key=key, value=AnyValue(string_value=value))


def log_record(result: EvaluationResult, now_unix: float) -> LogRecord:
    """One result as its OTLP log record (see the module docstring)."""
    attrs = [_kv("gen_ai.evaluation.name", result.name)]
    if result.score is not None:
        attrs.append(_kv("gen_ai.evaluation.score.value", float(result.score)))
    if result.label is not None:
        attrs.append(_kv("gen_ai.evaluation.score.label", result.label))
    if result.explanation is not None:
        attrs.append(_kv("gen_ai.evaluation.explanation", result.explanation))
    if result.span is None:
        attrs.append(_kv("gen_ai.conversation.id", result.conversation_id))
    if result.agent:
        attrs.append(_kv("gen_ai.agent.name", result.agent))
    if result.model:
        attrs.append(_kv("gen_ai.request.model", result.model))
    attrs += [
        _kv(EVALUATOR_ID, EVALUATOR_NAME),
        _kv(EVALUATOR_VERSION, evaluator_version()),
    ]
    p = result.provenance
    if p is not None:
        attrs.append(_kv("sidecar.base_model", p.base_model))
        if p.adapter is not None:
            attrs.append(_kv("sidecar.adapter", p.adapter))
        if p.adapter_version is not None:
            attrs.append(_kv("sidecar.adapter.version", p.adapter_version))
        attrs.append(_kv("sidecar.rule", p.rule))
        if p.threshold is not None:
            attrs.append(_kv("sidecar.threshold", float(p.threshold)))
    attrs += [
        _kv("log.record.uid", result.record_id),
        _kv("sidecar.turn", result.turn),
        _kv("sidecar.hook", result.hook),
    ]
    if result.final:
        attrs.append(_kv("sidecar.final", True))
    now_ns = int(now_unix * 1e9)
    record = LogRecord(
        time_unix_nano=int(result.time_unix * 1e9) if result.time_unix else now_ns,
        observed_time_unix_nano=now_ns,
        severity_number=SeverityNumber.SEVERITY_NUMBER_INFO,
        severity_text="INFO",
        event_name=EVENT_NAME,
        attributes=attrs,
    )
    if result.span is not None:
        record.trace_id = bytes.fromhex(result.span.trace_id)
        record.span_id = bytes.fromhex(result.span.span_id)
        record.flags = 0
    return record


def export_request(batch: Sequence[EvaluationResult], service_name: str, now_unix: float) -> ExportLogsServiceRequest:
    """The ``ExportLogsServiceRequest`` of one batch: one resource, one scope, a record per result."""
    resource = Resource(attributes=[_kv("service.name", service_name)])
    scope = InstrumentationScope(name=SCOPE_NAME)
    logs = ScopeLogs(scope=scope, log_records=[log_record(r, now_unix) for r in batch])
    return ExportLogsServiceRequest(resource_logs=[ResourceLogs(resource=resource, scope_logs=[logs])])


class OtlpEvaluationsSink(ResultsSink):
    """POSTs batches of evaluation log records to one OTLP/HTTP logs endpoint."""

    name = "otlp"

    def __init__(
        self,
        cfg: OtlpEvaluationsConfig,
        metrics: EvaluationMetrics,
        *,
        include_text: bool,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self._cfg = cfg
        headers = {k: v.get_secret_value() for k, v in cfg.headers.items()}
        self._http = HttpDestination(
            self.name,
            cfg.endpoint,
            timeout_seconds=cfg.delivery.timeout_seconds,
            headers={**headers, "user-agent": USER_AGENT, "content-type": "application/x-protobuf"},
            transport=transport,
        )
        super().__init__([self._http], cfg.delivery, metrics, include_text=include_text)

    async def send(self, batch: Sequence[EvaluationResult]) -> None:
        body = export_request(batch, self._cfg.service_name, time.time()).SerializeToString()
        await self._http.post(body, {})
