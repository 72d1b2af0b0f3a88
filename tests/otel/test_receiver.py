"""The OTLP/HTTP receiver over real HTTP: answers, limits, auth, and 200 only after Kafka acknowledged."""

from __future__ import annotations

import gzip
from collections.abc import AsyncIterator, Sequence
from typing import Any

import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse
from prometheus_client import CollectorRegistry

from sidecar.otel.config import OtlpReceiverConfig
from sidecar.otel.ingest import OtelIngest
from sidecar.otel.metrics import OtelMetrics
from sidecar.otel.producer import KafkaUnavailable
from sidecar.otel.receiver import OtlpHttpReceiver
from tests.otel.conftest import refused
from tests.otel.spans import chat_attrs, conversation, decoded, dedup, encode, make_span, native_events, traces

PROTO = {"Content-Type": "application/x-protobuf"}


class RecordingProducer:
    """Stands in for Kafka: keeps what was acknowledged; ``down`` makes every batch fail."""

    def __init__(self) -> None:
        self.acked: list[tuple[bytes, bytes]] = []
        self.down = False

    async def produce(
        self, topic: str, records: Sequence[tuple[bytes, bytes | None]], *, timeout_seconds: float, headers: Any = None
    ) -> None:
        if self.down:
            raise KafkaUnavailable("brokers down")
        self.acked += [(k, v) for k, v in records if v is not None]

    async def stop(self) -> None:
        pass


@pytest.fixture
async def served(registry: CollectorRegistry) -> AsyncIterator[tuple[httpx.AsyncClient, RecordingProducer]]:
    cfg = OtlpReceiverConfig(
        enabled=True,
        host="127.0.0.1",
        port=0,
        max_body_bytes=64 * 1024,
        max_decompressed_bytes=256 * 1024,
        bearer_token="s3cret",
    )
    metrics = OtelMetrics(registry)
    producer = RecordingProducer()
    from sidecar.otel.config import OtelConfig

    ingest = OtelIngest(OtelConfig(hold={"parent_seconds": 0, "logs_seconds": 0}), metrics, max_event_bytes=1 << 20)
    receiver = OtlpHttpReceiver(cfg, ingest, producer, metrics, events_topic="events")  # type: ignore[arg-type]
    await receiver.start()
    try:
        async with httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{receiver.port}", headers={"Authorization": "Bearer s3cret"}
        ) as client:
            yield client, producer
    finally:
        await receiver.stop()
        await receiver.stop()  # idempotent


def payload(cid: str = "c-1", turns: int = 1, encoding: str = "otlp_proto") -> bytes:
    return encode(traces([make_span(chat_attrs("genai", conversation(turns), cid))]), encoding)


async def test_protobuf_json_and_gzip(served: tuple[httpx.AsyncClient, RecordingProducer]) -> None:
    client, producer = served
    r = await client.post("/v1/traces", content=payload("p"), headers=PROTO)
    assert r.status_code == 200
    assert r.headers["Content-Type"].startswith("application/x-protobuf")
    assert ExportTraceServiceResponse.FromString(r.content).partial_success.rejected_spans == 0
    r = await client.post(
        "/v1/traces", content=payload("j", encoding="otlp_json"), headers={"Content-Type": "application/json"}
    )
    assert r.status_code == 200
    assert r.json() == {}
    r = await client.post(
        "/v1/traces", content=gzip.compress(payload("g")), headers={**PROTO, "Content-Encoding": "gzip"}
    )
    assert r.status_code == 200
    logs = dedup(decoded(producer.acked))
    for cid in ("p", "j", "g"):
        assert [e.message for e in logs[cid]] == [e.message for e in native_events(cid, conversation(1))]


async def test_refused_spans_are_reported_as_partial_success(
    served: tuple[httpx.AsyncClient, RecordingProducer],
    registry: CollectorRegistry,
) -> None:
    client, _ = served
    capture_off = make_span({"gen_ai.operation.name": "chat", "gen_ai.conversation.id": "c"})
    no_id = make_span(chat_attrs("genai", conversation(1), None))
    r = await client.post("/v1/traces", content=traces([capture_off, no_id]).SerializeToString(), headers=PROTO)
    assert r.status_code == 200
    partial = ExportTraceServiceResponse.FromString(r.content).partial_success
    assert partial.rejected_spans == 2
    message = partial.error_message
    # the counts, then each cause's fix in words
    assert message.startswith("refused spans: content_missing_capture_off=1, no_conversation_id=1.")
    assert "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=SPAN_ONLY" in message
    assert "no_conversation_id: no gen_ai.conversation.id" in message
    assert refused(registry, "content_missing_capture_off", "receiver") == 1


@pytest.mark.parametrize(
    ("body", "headers", "status", "reason"),
    [
        (b"\x0a\xff\xff", PROTO, 400, "invalid_protobuf"),
        (b"{", {"Content-Type": "application/json"}, 400, "invalid_json"),
        (b"x", {"Content-Type": "text/plain"}, 415, "unsupported_content_type"),
        (b"x", {**PROTO, "Content-Encoding": "br"}, 415, "unsupported_content_type"),
        (b"x" * (65 * 1024), PROTO, 413, "oversized"),
        (gzip.compress(b"\0" * (1 << 20)), {**PROTO, "Content-Encoding": "gzip"}, 413, "oversized"),
        (b"not gzip", {**PROTO, "Content-Encoding": "gzip"}, 400, "invalid_gzip"),
        (b"", PROTO, 400, "empty"),
    ],
    ids=["bad_proto", "bad_json", "text", "brotli", "too_big", "gzip_bomb", "bad_gzip", "empty"],
)
async def test_clear_4xx(
    served: tuple[httpx.AsyncClient, RecordingProducer],
    registry: CollectorRegistry,
    body: bytes,
    headers: dict[str, str],
    status: int,
    reason: str,
) -> None:
    client, producer = served
    r = await client.post("/v1/traces", content=body, headers=headers)
    assert r.status_code == status
    assert r.text.startswith(reason)
    assert refused(registry, reason, "receiver") == 1
    assert producer.acked == []


async def test_bearer_token(served: tuple[httpx.AsyncClient, RecordingProducer]) -> None:
    client, producer = served
    for auth in ({"Authorization": ""}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"}):
        r = await client.post("/v1/traces", content=payload(), headers={**PROTO, **auth})
        assert r.status_code == 401
        assert "s3cret" not in r.text
    assert producer.acked == []


async def test_kafka_down_is_503_and_the_retry_delivers_everything(
    served: tuple[httpx.AsyncClient, RecordingProducer],
) -> None:
    client, producer = served
    assert (await client.post("/v1/traces", content=payload("k", turns=1), headers=PROTO)).status_code == 200
    producer.down = True
    r = await client.post("/v1/traces", content=payload("k", turns=2), headers=PROTO)
    assert r.status_code == 503
    assert r.headers["Retry-After"] == "5"
    producer.down = False
    # the exporter retries the same batch: nothing of it may have been lost in the memory of the door
    assert (await client.post("/v1/traces", content=payload("k", turns=2), headers=PROTO)).status_code == 200
    logs = dedup(decoded(producer.acked))
    assert [e.message for e in logs["k"]] == [e.message for e in native_events("k", conversation(2))]


async def test_only_post_on_the_otlp_path(served: tuple[httpx.AsyncClient, RecordingProducer]) -> None:
    client, _ = served
    assert (await client.get("/v1/traces")).status_code == 405
    assert (await client.get("/v1/logs")).status_code == 405
    assert (await client.post("/v1/metrics", content=b"", headers=PROTO)).status_code == 404


async def test_multi_member_gzip_delivers_every_member_and_trailing_bytes_are_400(
    served: tuple[httpx.AsyncClient, RecordingProducer], registry: CollectorRegistry
) -> None:
    client, producer = served
    headers = {**PROTO, "Content-Encoding": "gzip"}
    two = gzip.compress(payload("m-1")) + gzip.compress(payload("m-2"))
    answer = await client.post("/v1/traces", content=two, headers=headers)
    assert answer.status_code == 200
    assert {k for k, _ in producer.acked} == {b"m-1", b"m-2"}
    answer = await client.post("/v1/traces", content=gzip.compress(payload("m-3")) + b"trailing", headers=headers)
    assert answer.status_code == 400
    assert "invalid_gzip" in answer.text
    assert refused(registry, "invalid_gzip", "receiver") == 1
    assert b"m-3" not in {k for k, _ in producer.acked}
