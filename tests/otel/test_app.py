"""Wired in the app: spans posted to the receiver reach the sidecar's own pipeline, and a retried
request is dropped by its dedup (each outcome once in the results topic)."""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest

from sidecar.config import load_config
from sidecar.tools.demo.mock_cluster import MockKafkaCluster
from tests.integration.kafka_support import free_port, read_topic, result_keys, write_config
from tests.integration.test_kafka_source import Running
from tests.otel.spans import chat_attrs, conversation, encode, make_span, model_calls, traces


@pytest.fixture(scope="module")
def kafka() -> Iterator[str]:
    with MockKafkaCluster(1) as cluster:
        yield cluster.bootstrap_servers


@pytest.fixture
async def running() -> AsyncIterator[list[Running]]:
    started: list[Running] = []
    yield started
    for r in started:
        if not r.task.done():
            await r.close()


@pytest.mark.slow
async def test_receiver_feeds_the_pipeline_exactly_once(kafka: str, tmp_path: Path, running: list[Running]) -> None:
    topic, port = "otel-app", free_port()
    cfg = load_config(
        write_config(
            tmp_path / "c.yaml",
            kafka,
            topic,
            otel={"receiver": {"enabled": True, "host": "127.0.0.1", "port": port, "allow_unauthenticated": True}},
        )
    )
    calls = model_calls(conversation(2))

    async def post(chat_calls: list[list[dict[str, object]]]) -> None:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
            for call in chat_calls:
                body = encode(traces([make_span(chat_attrs("genai", call, "app-1"))]), "otlp_proto")
                answer = await client.post(
                    "/v1/traces", content=body, headers={"Content-Type": "application/x-protobuf"}
                )
                assert answer.status_code == 200

    r = Running(cfg)
    running.append(r)
    await r.ready.wait()
    await post(calls)
    await r.wait_for("sidecar_events_consumed_total", len(conversation(2)))
    assert r.metric("sidecar_otel_events_produced_total", door="receiver") == len(conversation(2))
    await r.close()
    # Restarted, the door has forgotten the conversation; an exporter retries the last batch: the
    # whole history is derived again, with the same ids, and the sidecar's dedup drops all of it.
    r = Running(cfg)
    running.append(r)
    await r.ready.wait()
    await post(calls[-1:])
    await r.wait_for("sidecar_events_dead_lettered_total", len(conversation(2)), reason="duplicate_event")
    await r.close()
    keys = Counter(result_keys(await read_topic(kafka, f"{topic}.results", idle_seconds=0.5)))
    assert keys[("app-1", 1, "user_message")] == 1
    assert keys[("app-1", 2, "user_message")] == 1
    assert keys[("app-1", 1, "turn_closed")] == 1
    assert max(keys.values()) == 1
