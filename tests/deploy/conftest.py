"""Fixtures of the deploy tests: the chart's tools, and one running sidecar for the whole session.

The running sidecar is a real ``sidecar run`` process against librdkafka's mock Kafka cluster,
with scoring on the suite's vLLM server, LLM-free goal clustering on, and escalation alerts on with
a Kafka alert sink (a topic on the same mock cluster), so that every metric family the code
registers is on its /metrics, the alert sinks' labelled series included. The metric-name test
scrapes it; the end-to-end alerting test points a real Prometheus at it.
"""

from __future__ import annotations

import asyncio
import os
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from sidecar.tools.demo.mock_cluster import MockKafkaCluster
from sidecar.tools.demo.replay import conversation_events, encode, interleave, load_sample
from sidecar.tools.ports import free_port
from tests.deploy.chart import ToolMissing, helm_binary
from tests.integration.kafka_support import SidecarProcess, produce_raw, write_config
from tests.support.vllm_server import VllmServer

TOPIC = "deploy"
ALERTS_TOPIC = f"{TOPIC}.alerts"
# Malformed records: each is dead-lettered (invalid_json, not_an_object, schema).
MALFORMED: tuple[bytes, ...] = (b"{not json", b"[1, 2, 3]", b'{"v": 1, "type": "message"}')
AGENTS = ("booking", "support")


@pytest.fixture
def clean_environment() -> Iterator[None]:
    """No SIDECAR_* variable of this process reaches a config a test loads (restored afterwards)."""
    saved = {k: v for k, v in os.environ.items() if k.startswith("SIDECAR_")}
    for k in saved:
        del os.environ[k]
    yield
    for k in [k for k in os.environ if k.startswith("SIDECAR_")]:
        del os.environ[k]
    os.environ.update(saved)


@pytest.fixture(scope="session")
def helm() -> str:
    try:
        return helm_binary()
    except ToolMissing as exc:
        pytest.fail(str(exc))


def http_get(url: str, timeout: float = 5.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        body: bytes = resp.read()
    return body.decode("utf-8")


@dataclass
class RunningSidecar:
    """A ``sidecar run`` process: its /metrics URL, its Kafka and topic."""

    port: int
    bootstrap: str
    topic: str
    process: SidecarProcess

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/metrics"

    def metrics(self) -> str:
        return http_get(self.metrics_url)

    def produce(self, records: list[tuple[bytes | None, bytes]]) -> None:
        asyncio.run(produce_raw(self.bootstrap, self.topic, records))

    def produce_conversations(self, count: int, prefix: str) -> None:
        sample = load_sample()[:count]
        convs = [
            conversation_events(r, conversation_id=f"{prefix}-{i}", agent=AGENTS[i % len(AGENTS)])
            for i, r in enumerate(sample)
        ]
        self.produce([encode(e) for e in interleave(convs, concurrency=10, seed=1)])

    def produce_malformed(self, tag: str) -> None:
        self.produce([(f"bad-{tag}-{i}".encode(), v) for i, v in enumerate(MALFORMED)])


def _wait_metrics(sidecar: RunningSidecar, log: Path, deadline_seconds: float) -> None:
    deadline = time.monotonic() + deadline_seconds
    while time.monotonic() < deadline:
        if not sidecar.process.alive():
            pytest.fail(f"the sidecar exited:\n{log.read_text(errors='replace')[-4000:]}")
        try:
            if "sidecar_events_consumed_total" in sidecar.metrics():
                return
        except OSError:
            pass
        time.sleep(0.5)
    pytest.fail(f"the sidecar's /metrics did not answer:\n{log.read_text(errors='replace')[-4000:]}")


@pytest.fixture(scope="session")
def running_sidecar(vllm_server: VllmServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningSidecar]:
    """``sidecar run`` with scoring (live adapter routing included), goal clustering, alerting, the
    judge and the training store on, fed with sample and malformed records."""
    root = tmp_path_factory.mktemp("deploy-sidecar")
    port = free_port()
    with MockKafkaCluster() as kafka:
        bootstrap = kafka.bootstrap_servers
        cfg = write_config(
            root / "sidecar.yaml", bootstrap, TOPIC,
            http={"host": "127.0.0.1", "port": port},
            state={"turn_debounce_seconds": 1.0},
            kafka={"revoke_grace_seconds": 1.0, "revoke_flush_timeout_seconds": 2.0},
            scoring={
                "enabled": True,
                "vllm": {"base_url": vllm_server.base_url, "base_model": vllm_server.base_model},
                "tokenizer": {"model_dir": str(vllm_server.model_dir)},
                # Light on the shared server: a few trees and completions are enough to export
                # every scoring series.
                "agents": {a: {"adapter": vllm_server.adapter_model, "tree_sample_rate": 0.2} for a in AGENTS},
                "tree": {"max_depth_tokens": 4, "max_requests": 4},
                "completion": {"max_remaining_tokens": 4},
                # The adapter-routes panel reads sidecar_adapter_route_* (registered with routing).
                "routing": {"enabled": True, "replication_factor": 1},
            },
            clustering={"enabled": True, "mode": "extractive", "k1": 4, "min_conversations": 10,
                        "recluster_interval_seconds": 2},
            # The alert-sink series (sidecar_alert_sink_up{sink}, ...) exist only with a sink.
            alerting={"enabled": True, "sinks": {"kafka": {"enabled": True, "topic": ALERTS_TOPIC}}},
            # Registered so that their families are exported (the dashboards read them); the judge
            # samples nothing, so it sends the shared server no request.
            judge={"enabled": True, "sample_rate": 0.0,
                   "llm": {"base_url": vllm_server.base_url, "model": vllm_server.base_model}},
            training_store={"enabled": True, "backend": "file", "directory": str(root / "training")},
            # The OpenTelemetry panels read sidecar_otel_* (registered with a door on).
            otel={"receiver": {"enabled": True, "host": "127.0.0.1", "port": free_port(),
                               "allow_unauthenticated": True}},
        )  # fmt: skip
        log = root / "sidecar.log"
        process = SidecarProcess(cfg, log)
        sidecar = RunningSidecar(port, bootstrap, TOPIC, process)
        process.start()
        try:
            _wait_metrics(sidecar, log, 120)
            sidecar.produce_conversations(20, "warm")
            sidecar.produce_malformed("warm")
            yield sidecar
        finally:
            process.terminate()
