"""GenAI content as OTLP log records (``POST /v1/logs``): joined to its span by trace and span id,
whichever comes first, and rebuilt exactly as if the content were on the span; a span whose content
does not come is refused with the cause told apart; hostile input on /v1/logs is refused like on
/v1/traces."""

from __future__ import annotations

import base64
import gzip
import json
from collections.abc import AsyncIterator, Sequence
from typing import Any

import httpx
import pytest
from google.protobuf import json_format
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceResponse
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.logs.v1.logs_pb2 import LogRecord, LogsData
from opentelemetry.proto.trace.v1.trace_pb2 import Span
from prometheus_client import CollectorRegistry

from sidecar.otel.config import OtelConfig, OtlpReceiverConfig
from sidecar.otel.ingest import OtelIngest
from sidecar.otel.metrics import OtelMetrics
from sidecar.otel.receiver import OtlpHttpReceiver
from sidecar.otel.wire import _tag_len
from tests.otel.conftest import refused
from tests.otel.spans import any_value, chat_attrs, conversation, decoded, make_span, model_calls, traces
from tests.otel.test_backlog import Clock
from tests.otel.test_receiver import PROTO, RecordingProducer

CONTENT = ("gen_ai.input.messages", "gen_ai.output.messages", "gen_ai.system_instructions")


def split(span: Span) -> tuple[Span, LogRecord]:
    """The same model call in event mode: the span without content, and the inference-details log
    record in its context with the content as structured attributes (as opentelemetry-util-genai
    writes it for events)."""
    bare = Span()
    bare.CopyFrom(span)
    del bare.attributes[:]
    record = LogRecord(
        event_name="gen_ai.client.inference.operation.details",
        trace_id=span.trace_id,
        span_id=span.span_id,
        time_unix_nano=span.end_time_unix_nano,
    )
    for kv in span.attributes:
        if kv.key in CONTENT:
            record.attributes.append(KeyValue(key=kv.key, value=any_value(json.loads(kv.value.string_value))))
        else:
            bare.attributes.append(kv)
            if kv.key.startswith("gen_ai.request"):
                record.attributes.append(kv)
    return bare, record


def logs(records: Sequence[LogRecord]) -> LogsData:
    data = LogsData()
    rl = data.resource_logs.add()
    rl.resource.attributes.add(key="service.name", value=AnyValue(string_value="agent"))
    sl = rl.scope_logs.add()
    sl.scope.name = "opentelemetry.instrumentation.openai_v2"
    sl.log_records.extend(records)
    return data


def logs_json(data: LogsData) -> bytes:
    raw = json_format.MessageToDict(data)
    for rl in raw.get("resourceLogs", []):
        for sl in rl.get("scopeLogs", []):
            for record in sl.get("logRecords", []):
                for key in ("traceId", "spanId"):
                    if key in record:
                        record[key] = base64.b64decode(record[key]).hex()
    return json.dumps(raw).encode()


def fresh(registry: CollectorRegistry | None = None, clock: Clock | None = None, **hold: float) -> OtelIngest:
    return OtelIngest(
        OtelConfig(hold=hold),
        OtelMetrics(registry or CollectorRegistry()),
        max_event_bytes=1 << 20,
        clock=clock or Clock(),
    )


def calls(cid: str, turns: int = 2) -> list[Span]:
    return [
        make_span(chat_attrs("genai", call, cid), start=10 + i)
        for i, call in enumerate(model_calls(conversation(turns)))
    ]


def on_spans(spans: list[Span]) -> list[Any]:
    ingest = fresh(logs_seconds=0)
    return [e for s in spans for e in decoded(ingest.derive(traces([s]), "receiver").records)]


@pytest.mark.parametrize("logs_first", [False, True])
def test_content_as_log_records_is_rebuilt_exactly(logs_first: bool) -> None:
    spans = calls("lg-1")
    ingest = fresh()
    events = []
    for span in spans:
        bare, record = split(span)
        if logs_first:
            events += decoded(ingest.derive([], "receiver", logs=[logs([record])]).records)
            events += decoded(ingest.derive(traces([bare]), "receiver").records)
        else:
            events += decoded(ingest.derive(traces([bare]), "receiver").records)
            assert ingest.holding == 1
            events += decoded(ingest.derive([], "receiver", logs=[logs([record])]).records)
        assert ingest.holding == 0
    expected = on_spans(spans)
    assert [(e.event_id, e.seq, e.message, e.span) for e in events] == [
        (e.event_id, e.seq, e.message, e.span) for e in expected
    ]


def test_per_message_events_as_log_records() -> None:
    """Conventions v1.27-v1.36: a record per message, the message in the body."""
    history = [*conversation(1)[:2], {"role": "assistant", "content": "Hello."}]
    span = make_span(chat_attrs("genai", history, "lg-2"))
    bare, _ = split(span)
    records = []
    for i, m in enumerate(history[:-1]):
        body = AnyValue()
        body.kvlist_value.values.add(key="content", value=AnyValue(string_value=m["content"]))
        records.append(
            LogRecord(
                event_name=f"gen_ai.{m['role']}.message",
                trace_id=span.trace_id,
                span_id=span.span_id,
                time_unix_nano=i + 1,
                body=body,
            )
        )
    choice = AnyValue()
    choice.kvlist_value.values.add(key="index", value=AnyValue(int_value=0))
    choice.kvlist_value.values.add(key="message", value=any_value({"role": "assistant", "content": "Hello."}))
    records.append(
        LogRecord(
            event_name="gen_ai.choice", trace_id=span.trace_id, span_id=span.span_id, time_unix_nano=9, body=choice
        )
    )
    ingest = fresh()
    ingest.derive(traces([bare]), "receiver")
    events = decoded(ingest.derive([], "receiver", logs=[logs(records)]).records)
    assert [e.event_id for e in events] == [e.event_id for e in on_spans([span])]


def test_content_that_does_not_come_is_refused_with_its_cause() -> None:
    registry, clock = CollectorRegistry(), Clock()
    ingest = fresh(registry, clock, logs_seconds=2.0)
    first, second = calls("lg-3", turns=1)
    bare_first, _ = split(first)
    assert ingest.derive(traces([bare_first]), "receiver").records == []
    clock.now += 2.5
    derived = ingest.derive([], "receiver")
    # no GenAI log record ever came: capture is off
    assert derived.refused == {"content_missing_capture_off": 1}
    assert registry.get_sample_value("sidecar_otel_holds_total", {"wait": "logs", "outcome": "expired"}) == 1
    # once the app is seen sending content as logs, a call whose content does not come is told apart
    other = calls("lg-4", turns=1)[0]
    _, other_record = split(other)
    ingest.derive([], "receiver", logs=[logs([other_record])])
    bare_second, _ = split(second)
    ingest.derive(traces([bare_second]), "receiver")
    clock.now += 2.5
    assert ingest.derive([], "receiver").refused == {"content_on_logs_not_received": 1}
    # content whose span never came is dropped at the same deadline, counted
    assert registry.get_sample_value("sidecar_otel_holds_total", {"wait": "span", "outcome": "expired"}) == 1


def test_content_by_reference_is_a_named_refusal() -> None:
    span = calls("lg-5", turns=1)[0]
    bare, _ = split(span)
    ref = LogRecord(
        event_name="gen_ai.client.inference.operation.details", trace_id=span.trace_id, span_id=span.span_id
    )
    ref.attributes.add(key="gen_ai.input.messages_ref", value=AnyValue(string_value="gs://bucket/x-inputs.json"))
    ref.attributes.add(key="gen_ai.output.messages_ref", value=AnyValue(string_value="gs://bucket/x-outputs.json"))
    ingest = fresh(logs_seconds=0)
    assert ingest.derive([], "receiver", logs=[logs([ref])]).refused == {"content_by_reference": 1}
    on_span = Span()
    on_span.CopyFrom(bare)
    on_span.attributes.add(key="gen_ai.input.messages_ref", value=AnyValue(string_value="gs://bucket/y.json"))
    assert ingest.derive(traces([on_span]), "receiver").refused == {"content_by_reference": 1}


def test_a_content_record_without_a_span_is_refused_and_others_are_ignored() -> None:
    span = calls("lg-6", turns=1)[0]
    _, record = split(span)
    record.span_id = b""
    unrelated = LogRecord(event_name="app.started", trace_id=span.trace_id, span_id=span.span_id)
    plain = LogRecord(body=AnyValue(string_value="GET /health 200"))
    derived = fresh().derive([], "receiver", logs=[logs([record, unrelated, plain])])
    assert derived.refused == {"log_without_span": 1}
    assert derived.records == []


def test_span_and_event_mode_takes_the_span_and_drops_the_copy() -> None:
    registry = CollectorRegistry()
    ingest = fresh(registry)
    span = calls("lg-7", turns=1)[0]
    _, record = split(span)
    events = decoded(ingest.derive(traces([span]), "receiver").records)
    again = ingest.derive([], "receiver", logs=[logs([record])])
    assert again.records == [] and again.refused == {}
    assert [e.event_id for e in events] == [e.event_id for e in on_spans([span])]
    assert registry.get_sample_value("sidecar_otel_holds_total", {"wait": "span", "outcome": "expired"}) is None


# --- over HTTP --------------------------------------------------------------------------------


@pytest.fixture
async def served(registry: CollectorRegistry) -> AsyncIterator[tuple[httpx.AsyncClient, RecordingProducer]]:
    cfg = OtlpReceiverConfig(
        enabled=True,
        host="127.0.0.1",
        port=0,
        max_body_bytes=64 * 1024,
        max_decompressed_bytes=256 * 1024,
        max_spans_per_request=50,
        bearer_token="s3cret",
    )
    metrics = OtelMetrics(registry)
    producer = RecordingProducer()
    ingest = OtelIngest(OtelConfig(), metrics, max_event_bytes=1 << 20)
    receiver = OtlpHttpReceiver(cfg, ingest, producer, metrics, events_topic="events")  # type: ignore[arg-type]
    await receiver.start()
    try:
        async with httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{receiver.port}", headers={"Authorization": "Bearer s3cret"}
        ) as client:
            yield client, producer
    finally:
        await receiver.stop()


@pytest.mark.parametrize("encoding", ["otlp_proto", "otlp_json"])
async def test_traces_then_logs_over_http(served: tuple[httpx.AsyncClient, RecordingProducer], encoding: str) -> None:
    client, producer = served
    spans = calls(f"http-{encoding}")
    for span in spans:
        bare, record = split(span)
        r = await client.post("/v1/traces", content=traces([bare]).SerializeToString(), headers=PROTO)
        assert r.status_code == 200
        if encoding == "otlp_proto":
            r = await client.post("/v1/logs", content=logs([record]).SerializeToString(), headers=PROTO)
            assert r.headers["Content-Type"].startswith("application/x-protobuf")
            assert ExportLogsServiceResponse.FromString(r.content).partial_success.rejected_log_records == 0
        else:
            r = await client.post(
                "/v1/logs", content=logs_json(logs([record])), headers={"Content-Type": "application/json"}
            )
            assert r.json() == {}
        assert r.status_code == 200
    assert [e.event_id for e in decoded(producer.acked)] == [e.event_id for e in on_spans(spans)]


def nested(depth: int) -> AnyValue:
    value = AnyValue(string_value="x")
    for _ in range(depth):
        outer = AnyValue()
        outer.array_value.values.append(value)
        value = outer
    return value


def deep_record(span: Span) -> bytes:
    record = LogRecord(
        event_name="gen_ai.client.inference.operation.details", trace_id=span.trace_id, span_id=span.span_id
    )
    record.attributes.add(key="gen_ai.input.messages", value=nested(40))
    return logs([record]).SerializeToString()


def proto_nesting_bomb(levels: int = 500) -> bytes:
    """A LogsData whose one attribute is an array in an array ... ``levels`` deep, written byte by
    byte (the protobuf library refuses to build it)."""
    value = AnyValue(string_value="x").SerializeToString()
    for _ in range(levels):
        value = _tag_len(5, _tag_len(1, value))  # AnyValue.array_value { ArrayValue.values }
    kv = _tag_len(1, b"gen_ai.input.messages") + _tag_len(2, value)
    record = LogRecord(event_name="gen_ai.client.inference.operation.details").SerializeToString() + _tag_len(6, kv)
    return _tag_len(1, _tag_len(2, _tag_len(2, record)))  # LogsData > ResourceLogs > ScopeLogs > LogRecord


def many_records() -> bytes:
    return logs([LogRecord(event_name="x") for _ in range(51)]).SerializeToString()


@pytest.mark.parametrize(
    ("body", "headers", "status", "reason"),
    [
        (b"\x0a\xff\xff", PROTO, 400, "invalid_protobuf"),
        (b"{", {"Content-Type": "application/json"}, 400, "invalid_json"),
        (
            b'{"resourceLogs": [{"scopeLogs": [{"logRecords": [{"traceId": "zz"}]}]}]}',
            {"Content-Type": "application/json"},
            400,
            "invalid_json",
        ),
        (b"[" * 100_000, {"Content-Type": "application/json"}, 413, "oversized"),
        (b'{"resourceLogs": ' + b"[" * 50_000, {"Content-Type": "application/json"}, 400, "invalid_json"),
        (b"x", {"Content-Type": "text/plain"}, 415, "unsupported_content_type"),
        (b"x" * (65 * 1024), PROTO, 413, "oversized"),
        (gzip.compress(b"\0" * (1 << 20)), {**PROTO, "Content-Encoding": "gzip"}, 413, "oversized"),
        (b"not gzip", {**PROTO, "Content-Encoding": "gzip"}, 400, "invalid_gzip"),
        (b"", PROTO, 400, "empty"),
        (many_records(), PROTO, 413, "too_many_spans"),
        (proto_nesting_bomb(), PROTO, 400, "invalid_protobuf"),
    ],
    ids=[
        "bad_proto",
        "bad_json",
        "bad_id",
        "json_bomb",
        "json_nesting",
        "text",
        "too_big",
        "gzip_bomb",
        "bad_gzip",
        "empty",
        "too_many",
        "proto_nesting",
    ],
)
async def test_hostile_logs_get_clear_4xx(
    served: tuple[httpx.AsyncClient, RecordingProducer],
    registry: CollectorRegistry,
    body: bytes,
    headers: dict[str, str],
    status: int,
    reason: str,
) -> None:
    client, producer = served
    r = await client.post("/v1/logs", content=body, headers=headers)
    assert r.status_code == status
    assert r.text.startswith(reason)
    assert refused(registry, reason, "receiver") == 1
    assert producer.acked == []


async def test_deep_content_on_logs_is_refused_not_raised(
    served: tuple[httpx.AsyncClient, RecordingProducer], registry: CollectorRegistry
) -> None:
    client, producer = served
    span = calls("deep", turns=1)[0]
    bare, _ = split(span)
    bare.attributes.add(key="gen_ai.conversation.id", value=AnyValue(string_value="deep"))
    await client.post("/v1/traces", content=traces([bare]).SerializeToString(), headers=PROTO)
    r = await client.post("/v1/logs", content=deep_record(span), headers=PROTO)
    assert r.status_code == 200
    partial = ExportLogsServiceResponse.FromString(r.content).partial_success
    assert partial.rejected_log_records == 1
    assert partial.error_message.startswith("refused spans: too_deep=1.")
    assert refused(registry, "too_deep", "receiver") == 1
    assert producer.acked == []


async def test_logs_need_the_bearer_token(served: tuple[httpx.AsyncClient, RecordingProducer]) -> None:
    client, producer = served
    body = logs([split(calls("auth", turns=1)[0])[1]]).SerializeToString()
    for auth in ({"Authorization": ""}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"}):
        r = await client.post("/v1/logs", content=body, headers={**PROTO, **auth})
        assert r.status_code == 401
        assert "s3cret" not in r.text
    assert producer.acked == []


# --- through the bridge: the Collector's traces and logs topics ---------------------------------


async def test_the_bridge_joins_the_logs_topic_to_the_traces_topic() -> None:
    from types import SimpleNamespace

    from aiokafka import TopicPartition

    from sidecar.otel.bridge import OtlpKafkaBridge
    from sidecar.source.config import KafkaConfig
    from tests.otel.test_backlog import Producer

    clock, registry = Clock(), CollectorRegistry()
    config = OtelConfig.model_validate({"bridge": {"enabled": True, "logs_topic": "otlp_logs"}})
    metrics = OtelMetrics(registry)
    ingest = OtelIngest(config, metrics, max_event_bytes=1 << 20, clock=clock)
    producer = Producer()
    kafka = KafkaConfig(bootstrap_servers="127.0.0.1:9", topic="events")
    door = OtlpKafkaBridge(config.bridge, kafka, ingest, producer, metrics)  # type: ignore[arg-type]
    spans = calls("br-1")
    offsets = {"otlp_spans": 0, "otlp_logs": 0}

    def record(topic: str, value: bytes) -> SimpleNamespace:
        offsets[topic] += 1
        return SimpleNamespace(topic=topic, partition=0, offset=offsets[topic] - 1, key=None, value=value)

    for i, span in enumerate(spans):
        bare, content = split(span)
        span_record = record("otlp_spans", traces([bare]).SerializeToString())
        log_record = record("otlp_logs", logs_json(logs([content])))  # the other encoding, told apart per record
        first, second = (span_record, log_record) if i % 2 else (log_record, span_record)
        await door.step([first])
        # whichever came first is held, and its record is not committed past
        read = {TopicPartition(first.topic, 0): first.offset + 1}
        assert door.committable(read) == {TopicPartition(first.topic, 0): first.offset}
        clock.now += 1.0
        await door.step([second])
        assert ingest.holding == 0
        assert door.committable(read) == read
    events = decoded((k, v) for _, k, v in producer.sent)
    assert [e.event_id for e in events] == [e.event_id for e in on_spans(spans)]
    assert [e.span for e in events] == [e.span for e in on_spans(spans)]


def test_the_logs_topic_differs_from_the_others() -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="logs_topic"):
        OtelConfig.model_validate({"bridge": {"topic": "t", "logs_topic": "t"}})
