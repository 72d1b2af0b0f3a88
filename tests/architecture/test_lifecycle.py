"""One lifecycle for every component, and every background task owned and watched.

Each component with a start/stop (or run) lifecycle is put through the same cases: stop before
start, stop twice, cancellation mid-way, and start -> stop leaving no task or thread of it behind,
both on its own and under the application's :class:`~sidecar.supervision.Supervisor`. Components
that need a broker or vLLM get fakes here (the real parts are tested in their own directories);
the Kafka source gets librdkafka's mock cluster.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import httpx
import pytest
from prometheus_client import CollectorRegistry
from structlog.testing import capture_logs

from sidecar.alerting.config import AlertingConfig, KafkaAlertSinkConfig, MqttSinkConfig, RetryConfig
from sidecar.alerting.escalation import Escalations
from sidecar.alerting.metrics import AlertMetrics
from sidecar.alerting.sinks.kafka import KafkaAlertSink
from sidecar.alerting.sinks.mqtt import MqttAlertSink
from sidecar.clustering.config import ClusteringConfig
from sidecar.clustering.live import GoalClusterer
from sidecar.evaluations import build_sinks as build_result_sinks
from sidecar.evaluations.config import EvaluationsConfig
from sidecar.judge.config import JudgeConfig
from sidecar.judge.hooks import JudgeHooks
from sidecar.lifecycle import Component
from sidecar.scoring.client import VllmClient
from sidecar.scoring.config import ScoringConfig, VllmEndpointConfig
from sidecar.scoring.hooks import ScoringHooks
from sidecar.source.config import KafkaConfig
from sidecar.source.kafka import KafkaEventSource
from sidecar.stage.pipeline import PostScoreStage
from sidecar.state.config import StateConfig
from sidecar.state.hooks import RecordingHooks
from sidecar.telemetry.config import HttpConfig
from sidecar.telemetry.http import HttpServer
from sidecar.telemetry.labels import AgentLabels
from sidecar.telemetry.loop_lag import LoopLagMonitor
from sidecar.telemetry.stream_metrics import StreamMetrics
from sidecar.training_store.config import TrainingStoreConfig
from sidecar.training_store.sink import TrainingStoreSink
from tests.clustering.fakes import HashEmbedder, OracleLLM
from tests.judge.fakes import FakeChatClient
from tests.support.tiny_model import build_tokenizer

FAST_RETRY = RetryConfig(initial_backoff_seconds=0.05, max_backoff_seconds=0.2)
# The default executor's threads belong to the event loop (asyncio.to_thread), not to a component.
_LOOP_THREADS = "asyncio_"


def _closed_port() -> int:
    """A local port nothing listens on: connections to it are refused at once."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _PendingProducer:
    """An aiokafka producer stand-in whose brokers never answer: start() waits forever."""

    async def start(self) -> None:
        await asyncio.Event().wait()

    async def stop(self) -> None:
        return None


def _kafka_alert_sink() -> KafkaAlertSink:
    return KafkaAlertSink(
        KafkaAlertSinkConfig(enabled=True, topic="alerts"),
        KafkaConfig(bootstrap_servers="127.0.0.1:1"),
        FAST_RETRY,
        producer_factory=lambda: cast("Any", _PendingProducer()),
    )


def _vllm_ok(request: httpx.Request) -> httpx.Response:
    return httpx.Response(200) if request.url.path == "/health" else httpx.Response(404)


@dataclass(frozen=True)
class Case:
    """How to build one component, the background tasks it runs once started, and its run()."""

    make: Callable[[Path, dict[str, Any]], Component]
    tasks: frozenset[str] = field(default_factory=frozenset)
    run: Callable[[Any], Awaitable[None]] | None = None


def _vllm_client(_tmp: Path, _env: dict[str, Any]) -> Component:
    config = VllmEndpointConfig(base_url="http://vllm.test/v1", health_check_interval_seconds=0.05)
    http = httpx.AsyncClient(transport=httpx.MockTransport(_vllm_ok))
    return VllmClient(config, CollectorRegistry(), http_client=http)


def _scoring(_tmp: Path, env: dict[str, Any]) -> Component:
    config = ScoringConfig.model_validate(
        {
            "enabled": True,
            "tokenizer": {"model_dir": str(env["tok"])},
            # The owned client probes a port nothing listens on: refused, retried, never fatal.
            "vllm": {"base_url": f"http://127.0.0.1:{_closed_port()}/v1", "health_check_interval_seconds": 0.05},
        }
    )
    return ScoringHooks.from_config(config, CollectorRegistry())


def _clusterer(_tmp: Path, _env: dict[str, Any]) -> Component:
    config = ClusteringConfig(enabled=True, recluster_interval_seconds=3600)
    return GoalClusterer(config, CollectorRegistry(), llm=OracleLLM(), embedder=HashEmbedder())


def _mqtt(_tmp: Path, _env: dict[str, Any]) -> Component:
    cfg = MqttSinkConfig(enabled=True, host="127.0.0.1", port=_closed_port(), client_id="lifecycle-test")
    return MqttAlertSink(cfg, FAST_RETRY)


def _escalations(_tmp: Path, _env: dict[str, Any]) -> Component:
    config = AlertingConfig.model_validate({"enabled": True})
    sinks = [_kafka_alert_sink()]
    return Escalations(config, sinks, AlertMetrics(CollectorRegistry()), group="g", agent_label=AgentLabels())


def _training_store(tmp: Path, _env: dict[str, Any]) -> Component:
    config = TrainingStoreConfig.model_validate({"enabled": True, "directory": tmp / "store"})
    return TrainingStoreSink(config, CollectorRegistry(), AgentLabels(), redacted=False)


def _result_sink(which: str) -> Callable[[Path, dict[str, Any]], Component]:
    """A results-out sink pointed at a closed port (nothing is delivered in these cases)."""

    def make(_tmp: Path, _env: dict[str, Any]) -> Component:
        url = f"http://127.0.0.1:{_closed_port()}"
        config = EvaluationsConfig.model_validate(
            {
                "otlp": {"enabled": which == "otlp", "endpoint": url + "/v1/logs"},
                "langfuse": {"enabled": which == "langfuse", "url": url, "public_key": "pk", "secret_key": "sk"},
                "phoenix": {"enabled": which == "phoenix", "url": url},
            }
        )
        (sink,) = build_result_sinks(config, CollectorRegistry())
        return sink

    return make


def _judge(_tmp: Path, _env: dict[str, Any]) -> Component:
    return JudgeHooks(JudgeConfig(enabled=True, sample_rate=1.0), CollectorRegistry(), client=FakeChatClient())


def _http(_tmp: Path, _env: dict[str, Any]) -> Component:
    return HttpServer(HttpConfig(host="127.0.0.1", port=0), CollectorRegistry(), [])


def _source(_tmp: Path, env: dict[str, Any]) -> Component:
    topic = f"lifecycle-{len(env.setdefault('topics', []))}"
    env["topics"].append(topic)
    kafka = KafkaConfig(
        bootstrap_servers=env["kafka"],
        topic=topic,
        group_id=f"g-{topic}",
        dead_letter_topic=f"{topic}.dlq",
        results_topic=f"{topic}.results",
        session_timeout_ms=6000,
        heartbeat_interval_ms=1000,
    )
    registry = CollectorRegistry()
    return KafkaEventSource(kafka, StateConfig(), RecordingHooks(), StreamMetrics(registry), PostScoreStage([]))


def _otel(bridge: bool, env: dict[str, Any]) -> Component:
    from sidecar.otel.bridge import OtlpKafkaBridge
    from sidecar.otel.config import OtelConfig, OtlpKafkaBridgeConfig, OtlpReceiverConfig
    from sidecar.otel.ingest import OtelIngest
    from sidecar.otel.metrics import OtelMetrics
    from sidecar.otel.producer import OtelEventProducer
    from sidecar.otel.receiver import OtlpHttpReceiver

    kafka = KafkaConfig(bootstrap_servers=env.get("kafka", f"127.0.0.1:{_closed_port()}"), topic="otel-lifecycle")
    metrics = OtelMetrics(CollectorRegistry())
    ingest = OtelIngest(OtelConfig(), metrics, max_event_bytes=1 << 20)
    producer = OtelEventProducer(kafka)
    if bridge:
        cfg = OtlpKafkaBridgeConfig(enabled=True, topic="otel-lifecycle-otlp", group_id="g-otel-lifecycle")
        return OtlpKafkaBridge(cfg, kafka, ingest, producer, metrics)
    return OtlpHttpReceiver(
        OtlpReceiverConfig(enabled=True, host="127.0.0.1", port=0, bearer_token="t"),
        ingest,
        producer,
        metrics,
        events_topic=kafka.topic,
    )


async def _source_run(source: Any) -> None:
    await cast("KafkaEventSource", source).run()


CASES: dict[str, Case] = {
    "vllm-client": Case(_vllm_client, frozenset({"vllm-health"})),
    "scoring-hooks": Case(_scoring, frozenset({"vllm-health"})),
    "goal-clusterer": Case(_clusterer, frozenset({"clustering.scheduler"})),
    "alert-sink-mqtt": Case(_mqtt, frozenset({"alert-sink-mqtt"})),
    "alert-sink-kafka": Case(lambda _t, _e: _kafka_alert_sink(), frozenset({"alert-sink-kafka"})),
    "escalations": Case(_escalations, frozenset({"alert-sink-kafka"})),
    "training-store": Case(_training_store),
    "evaluations-otlp": Case(_result_sink("otlp"), frozenset({"evaluations-otlp"})),
    "evaluations-langfuse": Case(_result_sink("langfuse"), frozenset({"evaluations-langfuse"})),
    "evaluations-phoenix": Case(_result_sink("phoenix"), frozenset({"evaluations-phoenix"})),
    "judge-hooks": Case(_judge),
    "http-server": Case(_http),
    "kafka-source": Case(_source, run=_source_run),
    "otel-receiver": Case(lambda _t, e: _otel(False, e)),
    "otel-bridge": Case(lambda _t, e: _otel(True, e), frozenset({"otel-bridge"})),
}


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("tok")
    build_tokenizer(d)
    return d


@pytest.fixture
def env(request: pytest.FixtureRequest) -> dict[str, Any]:
    """What a case needs built once per module: a broker for the source, a tokenizer for scoring
    (only the cases that need one start it)."""
    name = request.node.callspec.params.get("name")
    if name in ("kafka-source", "otel-bridge"):
        return {"kafka": request.getfixturevalue("kafka")}
    if name == "scoring-hooks":
        return {"tok": request.getfixturevalue("tok_dir")}
    return {}


def _threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if not t.name.startswith(_LOOP_THREADS)}


def _named(names: frozenset[str]) -> set[str]:
    return {t.get_name() for t in asyncio.all_tasks()} & names


async def _until(check: Callable[[], bool], what: str, limit_seconds: float = 10.0) -> None:
    """Poll ``check`` (state of other tasks, which signal nothing) until true or the limit."""
    deadline = asyncio.get_running_loop().time() + limit_seconds
    while not check():
        if asyncio.get_running_loop().time() > deadline:
            raise TimeoutError(what)
        await asyncio.sleep(0.01)


@asynccontextmanager
async def _leaves_nothing_behind() -> AsyncIterator[None]:
    """Fails unless every task and thread started inside has ended shortly after the block."""
    tasks, threads = asyncio.all_tasks(), _threads()
    yield
    me = asyncio.current_task()

    def left_tasks() -> set[asyncio.Task[Any]]:
        return {t for t in asyncio.all_tasks() - tasks if t is not me and not t.done()}

    def left_threads() -> set[threading.Thread]:
        return {t for t in _threads() - threads if t.is_alive()}

    try:
        await _until(lambda: not left_tasks() and not left_threads(), "")
    except TimeoutError:
        pytest.fail(f"left behind: tasks {[t.get_name() for t in left_tasks()]}, threads {left_threads()}")


_KNOWN_GAPS: dict[str, pytest.MarkDecorator] = {}


@pytest.mark.parametrize("name", [pytest.param(n, marks=_KNOWN_GAPS.get(n, ())) for n in sorted(CASES)])
async def test_stop_before_start_is_a_no_op(name: str, tmp_path: Path, env: dict[str, Any]) -> None:
    case = CASES[name]
    async with _leaves_nothing_behind():
        component = case.make(tmp_path, env)
        await component.stop()
        await component.stop()


@pytest.mark.parametrize("name", sorted(CASES))
async def test_start_then_stop_twice_leaves_nothing_behind(name: str, tmp_path: Path, env: dict[str, Any]) -> None:
    case = CASES[name]
    async with _leaves_nothing_behind():
        component = case.make(tmp_path, env)
        await component.start()
        await _until(lambda: _named(case.tasks) == case.tasks, f"{name} started {sorted(case.tasks)}")
        await component.stop()
        assert not _named(case.tasks)
        await component.stop()


@pytest.mark.parametrize("name", sorted(CASES))
async def test_cancellation_mid_way_propagates_and_stop_still_cleans_up(
    name: str, tmp_path: Path, env: dict[str, Any]
) -> None:
    """The task driving the component (its run(), or whoever awaits after start()) is cancelled:
    the cancellation reaches it (never swallowed), and a stop() afterwards still ends everything."""
    case = CASES[name]
    run = case.run
    async with _leaves_nothing_behind():
        component = case.make(tmp_path, env)
        started = asyncio.Event()

        async def life() -> None:
            await component.start()
            started.set()
            if run is not None:
                await run(component)
            else:
                await asyncio.Event().wait()

        driver = asyncio.create_task(life(), name="lifecycle-driver")
        async with asyncio.timeout(30):
            await started.wait()
        await asyncio.sleep(0.1)  # let the background tasks (and run()) get going
        assert not driver.done(), driver
        driver.cancel()
        await asyncio.wait({driver})
        assert driver.cancelled()
        await component.stop()
        await component.stop()


@pytest.mark.parametrize("name", sorted(n for n, c in CASES.items() if c.tasks))
async def test_background_tasks_belong_to_the_supervisor(name: str, tmp_path: Path, env: dict[str, Any]) -> None:
    """Started under the application's supervisor, a component's tasks are in its TaskGroup, are
    listed by name, and are stopped by the component itself (none is left for the supervisor)."""
    from sidecar.supervision import Supervisor  # here: the rest of this file also runs on older code

    case = CASES[name]
    supervisor = Supervisor()
    async with _leaves_nothing_behind():
        with capture_logs() as logs:
            async with supervisor.running():
                component = case.make(tmp_path, env)
                await component.start()
                await _until(lambda: set(supervisor.running_names()) == case.tasks, f"{name} under supervision")
                health = supervisor.health()
                assert health.ready
                assert all(task in health.detail for task in case.tasks)
                await component.stop()
                assert supervisor.running_names() == []
        assert not [e for e in logs if e["event"] == "task.left_running"]


async def test_a_run_only_loop_ends_on_cancellation() -> None:
    """The loop-lag probe has run() only: cancelled mid-way, it ends and raises CancelledError."""
    async with _leaves_nothing_behind():
        task = asyncio.create_task(LoopLagMonitor(CollectorRegistry(), interval=0.01).run(), name="loop-lag")
        await asyncio.sleep(0.05)
        task.cancel()
        await asyncio.wait({task})
        assert task.cancelled()


# -- a dead task fails readiness -------------------------------------------------------------------


class _DyingVllm:
    """/health answers 200 once; then the probe meets an error it does not expect, and its loop dies."""

    def __init__(self) -> None:
        self.probes = 0

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.url.path != "/health":
            return httpx.Response(404)
        self.probes += 1
        if self.probes > 1:
            raise RuntimeError("a bug in the probe path")
        return httpx.Response(200)


async def _readyz(port: int) -> tuple[int, dict[str, Any]]:
    async with httpx.AsyncClient() as http:
        resp = await http.get(f"http://127.0.0.1:{port}/readyz")
    return resp.status_code, resp.json()


async def test_a_dead_vllm_health_task_fails_readyz() -> None:
    """Its last answer was "healthy": without supervision /readyz went on saying so forever."""
    registry = CollectorRegistry()
    config = VllmEndpointConfig(base_url="http://vllm.test/v1", health_check_interval_seconds=0.05)
    client = VllmClient(config, registry, http_client=httpx.AsyncClient(transport=httpx.MockTransport(_DyingVllm())))
    server = HttpServer(HttpConfig(host="127.0.0.1", port=0, readiness="dependencies"), registry, [client])
    async with server:
        await client.start()
        try:
            status, body = await _readyz(server.port)
            for _ in range(100):
                if status == 503:
                    break
                await asyncio.sleep(0.05)
                status, body = await _readyz(server.port)
            assert status == 503, body
            assert "vllm-health" in json.dumps(body)
        finally:
            await client.stop()


async def test_in_the_app_a_dead_vllm_health_fails_readyz_by_default(
    kafka: str, tok_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With ``http.readiness: process`` a vLLM outage does not gate; a dead probe loop does."""
    from sidecar.app import run_app
    from sidecar.config import load_config
    from tests.integration.kafka_support import write_config

    real_probe = VllmClient.probe
    probes = 0

    async def probe_then_fail(self: VllmClient) -> bool:
        nonlocal probes
        probes += 1
        if probes > 1:
            raise RuntimeError("a bug in the probe path")
        return await real_probe(self)

    monkeypatch.setattr(VllmClient, "probe", probe_then_fail)
    port = _closed_port()
    vllm = {"base_url": f"http://127.0.0.1:{_closed_port()}/v1", "health_check_interval_seconds": 0.05}
    scoring = {"enabled": True, "tokenizer": {"model_dir": str(tok_dir)}, "vllm": vllm}
    config = load_config(write_config(tmp_path / "c.yaml", kafka, "dead-probe", http={"port": port}, scoring=scoring))
    ready, stop = asyncio.Event(), asyncio.Event()
    app = asyncio.create_task(run_app(config, ready=ready, stop=stop, registry=CollectorRegistry()))
    try:
        async with asyncio.timeout(60):
            await ready.wait()
            while True:
                status, body = await _readyz(port)
                checks = {c["name"]: c for c in body["checks"]}
                if checks["kafka"]["ready"] and probes > 1:
                    break
                await asyncio.sleep(0.1)
        assert status == 503, body
        tasks = {"name": "tasks", "ready": False, "gates": True, "detail": "vllm-health raised RuntimeError"}
        assert checks["tasks"] == tasks
        assert checks["vllm"]["ready"] is False
    finally:
        stop.set()
        await asyncio.wait_for(app, 60)
