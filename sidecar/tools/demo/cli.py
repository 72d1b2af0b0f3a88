"""``sidecar demo``: the whole pipeline on a laptop, with no Kafka to install.

It starts librdkafka's mock Kafka cluster in a helper process, runs the sidecar against it (the
same :func:`sidecar.app.run_app` that ``sidecar run`` uses, with ``kafka.bootstrap_servers``
pointed at the mock), and replays the bundled sample conversations as contract-v1 events at a set
rate, several conversations interleaved at once, while showing progress and the sidecar's counters.
Ctrl-C (or SIGTERM) stops the replay and the pipeline cleanly; a second Ctrl-C cancels at once.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import itertools
import os
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Protocol

import structlog
from prometheus_client import CollectorRegistry

from sidecar.config import SidecarConfig, load_config
from sidecar.errors import ConfigError
from sidecar.telemetry.logging import configure_logging
from sidecar.tools.demo import models
from sidecar.tools.demo.alert_feed import AlertFeed, follow_alerts
from sidecar.tools.demo.arguments import (
    GEMMA_RATE,
    SCORED_CONCURRENCY,
    SCORED_RATE,
    UNSCORED_CONCURRENCY,
    UNSCORED_RATE,
    add_arguments,
)
from sidecar.tools.demo.logfile import LogFile, quiet_progress_bars
from sidecar.tools.demo.mock_cluster import MockKafkaCluster
from sidecar.tools.demo.replay import (
    Event,
    SampleError,
    conversation_events,
    interleave,
    load_jsonl_gz,
    load_sample,
    produce,
)
from sidecar.tools.local_vllm import LocalVllmServer
from sidecar.tools.ports import free_port

if TYPE_CHECKING:  # rich (the tools extra) is imported when the demo runs, not when `sidecar run` parses
    from sidecar.tools.demo.display import DemoDisplay

log = structlog.get_logger()

EXIT_OK: Final = 0
EXIT_FAILURE: Final = 1
EXIT_USAGE: Final = 2
# The pipeline joins the consumer group and rebuilds state before it reports ready; on 2 cores
# against the mock cluster that takes a few seconds. Past this, the replay starts anyway (the
# consumer reads from the earliest offset, so nothing is missed) and says so.
READY_TIMEOUT_SECONDS: Final = 60.0
# After stop, the pipeline drains in-flight effects and commits; give it this long, then cancel.
STOP_TIMEOUT_SECONDS: Final = 30.0


class Pipeline(Protocol):
    """The shape of :func:`sidecar.app.run_app` the demo relies on."""

    def __call__(
        self,
        config: SidecarConfig,
        *,
        ready: asyncio.Event | None = ...,
        stop: asyncio.Event | None = ...,
        registry: CollectorRegistry | None = ...,
    ) -> Coroutine[Any, Any, None]: ...


def add_demo_parser(subparsers: Any, add_config_arg: Callable[[argparse.ArgumentParser], None]) -> None:
    """Register ``sidecar demo`` on the root parser's subparsers."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "demo",
        help="replay sample conversations through the sidecar on a local mock Kafka",
        description=(
            "Start a mock Kafka cluster, run the sidecar against it, and replay sample conversations "
            "(bundled, or --input) as events at --rate, --concurrency conversations interleaved. "
            "Ctrl-C stops everything cleanly."
        ),
    )
    add_config_arg(p)
    add_arguments(p)
    p.set_defaults(handler=run_demo)


def demo_events(records: Sequence[dict[str, Any]], *, loop: bool, concurrency: int, seed: int) -> Iterator[Event]:
    """The replay stream: every record once (or forever, round r under ids ``<id>#r<r>``), interleaved."""

    def conversations() -> Iterator[list[Event]]:
        for rnd in itertools.count() if loop else range(1):
            for rec in records:
                cid = rec["conversation_id"] if rnd == 0 else f"{rec['conversation_id']}#r{rnd}"
                yield conversation_events(rec, conversation_id=cid)

    return interleave(conversations(), concurrency=concurrency, seed=seed)


def _pages_url(config: SidecarConfig) -> str:
    """The operator listener's address, as a browser on this machine opens it."""
    host = config.http.host
    shown = "127.0.0.1" if host in ("", "0.0.0.0", "::") else host  # noqa: S104 - compared, not bound
    return f"http://{shown}:{config.http.port}"


def _default_pipeline() -> Pipeline:
    # Resolved at call time: `sidecar --help` and argument errors need not load the whole pipeline.
    run_app: Pipeline = importlib.import_module("sidecar.app").run_app
    return run_app


def run_demo(args: argparse.Namespace, *, pipeline: Pipeline | None = None) -> int:
    """``sidecar demo`` handler; returns the process exit code."""
    started = time.monotonic()
    # Before the pipeline imports sentence-transformers and the Hugging Face hub: their tqdm bars
    # would break up the live panel.
    quiet_progress_bars()
    log_file: LogFile | None = None
    try:
        records, base = _load_inputs(args)
        overrides: dict[str, Any] = {"http": {"port": _http_port(args, base), "host": _http_host(base)}}
        server, reason = _plan_models(args, overrides)
    except (SampleError, ConfigError, ValueError) as exc:
        print(f"sidecar demo: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except RuntimeError as exc:  # the model could not be prepared (e.g. the GGUF import failed)
        print(f"sidecar demo: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    try:
        cluster = MockKafkaCluster()
        bootstrap = cluster.start()
    except (RuntimeError, OSError) as exc:
        print(f"sidecar demo: cannot start the mock Kafka cluster: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    if args.rate is None:
        args.rate = (GEMMA_RATE if args.model != "bundled" else SCORED_RATE) if server is not None else UNSCORED_RATE
    if args.concurrency is None:
        args.concurrency = SCORED_CONCURRENCY if server is not None else UNSCORED_CONCURRENCY
    try:
        if server is not None:
            server.start()
            overrides["scoring"] = models.scoring_overrides(server)
        overrides["alerting"] = models.alerting_overrides(overrides["http"]["port"])
        # The mock cluster speaks plaintext only: a production file's TLS/SASL settings cannot apply.
        overrides["kafka"] = {"bootstrap_servers": bootstrap, "security_protocol": "PLAINTEXT"}
        config = load_config(args.config, overrides=overrides)
        log_file = _configure_logs(config)
        if server is None and args.scoring == "auto":
            print(f"sidecar demo: scoring off: {reason}", file=sys.stderr)
        return asyncio.run(
            _demo(config, args, records, pipeline or _default_pipeline(), server, log_file=log_file, started=started)
        )
    except asyncio.CancelledError:  # a second Ctrl-C cancelled the demo without waiting
        return 130
    except (ConfigError, OSError, RuntimeError, TimeoutError) as exc:
        print(f"sidecar demo: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    finally:
        if server is not None:
            server.stop()
        cluster.stop()
        if log_file is not None:
            log_file.close()


def _configure_logs(config: SidecarConfig) -> LogFile | None:
    """On a terminal, logs go to a file named on screen (warnings echoed); elsewhere to stderr."""
    if not (sys.stdout.isatty() and sys.stderr.isatty()):
        configure_logging(config.logging)
        return None
    log_file = LogFile(
        Path(tempfile.gettempdir()) / f"sidecar-demo-{os.getpid()}.log",
        echo=lambda text: print(text, file=sys.stderr, flush=True),
    )
    configure_logging(config.logging, stream=log_file)  # type: ignore[arg-type]  # a text stream
    print(f"sidecar demo: logs go to {log_file.path}", file=sys.stderr, flush=True)
    return log_file


def _load_inputs(args: argparse.Namespace) -> tuple[Sequence[dict[str, Any]], SidecarConfig]:
    records = load_sample() if args.input is None else load_jsonl_gz(args.input)
    base = load_config(args.config)
    if args.conversations is not None:
        if args.conversations > len(records):
            raise ValueError(f"--conversations {args.conversations}: only {len(records)} available")
        records = records[: args.conversations]
    if not records:
        raise ValueError("no conversations to replay")
    return records, base


def _http_host(base: SidecarConfig) -> str:
    # A demo on a laptop serves this machine only, unless a config file asks for another address
    # (`sidecar run` keeps 0.0.0.0: in a pod, Prometheus scrapes it from another host).
    return base.http.host if "host" in base.http.model_fields_set else "127.0.0.1"


def _http_port(args: argparse.Namespace, base: SidecarConfig) -> int:
    port: int = args.http_port if args.http_port is not None else base.http.port
    if port == 0:
        # Picked here rather than by the server so the address can be printed before it starts.
        port = free_port(base.http.host)
    return port


def _plan_models(args: argparse.Namespace, overrides: dict[str, Any]) -> tuple[LocalVllmServer | None, str | None]:
    """Decide scoring and goal clustering from --scoring/--goals; ValueError when asked for and impossible."""
    server = None
    reason = models.scoring_unavailable_reason(model=args.model)
    if (args.scoring == "on" or args.model != "bundled") and reason is not None:
        raise ValueError(f"--scoring on: {reason}" if args.scoring == "on" else f"--model {args.model}: {reason}")
    if args.model != "bundled" and args.scoring == "off":
        raise ValueError(f"--model {args.model} needs scoring (not --scoring off)")
    if args.scoring != "off" and reason is None:
        if args.model != "bundled":
            print(f"importing {args.model} if needed (once; 1-2 minutes)...", file=sys.stderr, flush=True)
        log_path = Path(tempfile.gettempdir()) / f"sidecar-demo-vllm-{os.getpid()}.log"
        server = models.local_server(log_path, model=args.model)
    if args.goals == "on" and not models.embeddings_available():
        raise ValueError("--goals on: the embeddings extra is not installed")
    if args.goals != "off" and models.embeddings_available():
        overrides["clustering"] = models.clustering_overrides()
    return server, reason


async def _start_scoring(server: LocalVllmServer | None) -> None:
    if server is None:
        return
    print(
        f"starting vLLM on {server.spec.model_dir} at {server.base_url} (1-2 minutes on a CPU)...",
        file=sys.stderr,
        flush=True,
    )
    await server.wait_ready()
    print("vLLM ready: scoring completion and response trees", file=sys.stderr, flush=True)


async def _demo(
    config: SidecarConfig,
    args: argparse.Namespace,
    records: Sequence[dict[str, Any]],
    pipeline: Pipeline,
    server: LocalVllmServer | None = None,
    *,
    log_file: LogFile | None = None,
    started: float | None = None,
) -> int:
    await _start_scoring(server)
    return await _replay(config, args, records, pipeline, log_file=log_file, started=started)


async def _replay(
    config: SidecarConfig,
    args: argparse.Namespace,
    records: Sequence[dict[str, Any]],
    pipeline: Pipeline,
    *,
    log_file: LogFile | None = None,
    started: float | None = None,
) -> int:
    stop, ready = asyncio.Event(), asyncio.Event()
    registry = CollectorRegistry()
    loop = asyncio.get_running_loop()
    main = asyncio.current_task()
    signals = 0

    def on_signal() -> None:
        nonlocal signals
        signals += 1
        stop.set()
        if signals > 1 and main is not None:
            main.cancel()

    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, on_signal)
    total = None if args.loop else sum(len(r["turns"]) + 1 for r in records)
    url = _pages_url(config)
    feed = AlertFeed(url)
    app = asyncio.create_task(pipeline(config, ready=ready, stop=stop, registry=registry), name="sidecar")
    follower = _follow_alerts(config, feed, stop)
    try:
        with _display(
            registry,
            total=total,
            pages_url=url,
            rate=args.rate,
            alerts=feed,
            log_path=None if log_file is None else str(log_file.path),
            started=started,
        ) as display:
            if log_file is not None:
                log_file.echo = display.note
            display.on_first_goal = lambda seconds: display.note(f"first goal named {seconds:.0f} s after the start")
            display.note(f"mock Kafka at {config.kafka.bootstrap_servers}, topic {config.kafka.topic}")
            display.note(f"overview at {url}/, metrics at {url}/metrics; Ctrl-C to stop")
            if not await _wait_ready(ready, stop, app, display):
                return await _finish(app, stop, display)
            return await _produce_then_finish(config, args, records, app, stop, display=display)
    finally:
        if log_file is not None:
            log_file.echo = lambda text: print(text, file=sys.stderr, flush=True)
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.remove_signal_handler(sig)
        if follower is not None:
            follower.cancel()
            await asyncio.wait({follower})
        await _cancel(app)


async def _produce_then_finish(
    config: SidecarConfig,
    args: argparse.Namespace,
    records: Sequence[dict[str, Any]],
    app: asyncio.Task[None],
    stop: asyncio.Event,
    *,
    display: DemoDisplay,
) -> int:
    """Replay the events, wait for Ctrl-C or --linger, stop the pipeline; the exit code."""
    events = demo_events(records, loop=args.loop, concurrency=args.concurrency, seed=args.seed)
    producer = asyncio.create_task(
        produce(
            config.kafka.bootstrap_servers,
            config.kafka.topic,
            events,
            rate=args.rate,
            progress=display.progress,
            stop=stop,
            stamp_now=True,
        ),
        name="demo-producer",
    )
    await asyncio.wait({producer, app}, return_when=asyncio.FIRST_COMPLETED)
    finished = producer.done() and not stop.is_set() and producer.exception() is None
    if finished:
        display.note(
            f"replayed all {producer.result()} events; "
            + ("Ctrl-C to stop" if args.linger is None else f"stopping in {args.linger:g} s")
        )
        if not app.done():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(args.linger):
                    await _wait_stop_or_app(stop, app)
    stop.set()
    produce_error: Exception | None = None
    try:
        sent = await producer
        if not finished:
            display.note(f"replay interrupted after {sent} events")
    except Exception as exc:
        produce_error = exc
    code = await _finish(app, stop, display)
    if produce_error is not None:
        display.note(f"sidecar demo: producing failed: {produce_error!r}")
        code = EXIT_FAILURE
    return code


def _follow_alerts(config: SidecarConfig, feed: AlertFeed, stop: asyncio.Event) -> asyncio.Task[None] | None:
    """Read the alert topic into ``feed`` for the screen, when alerts go to Kafka. Never fatal."""
    sink = config.alerting.sinks.kafka
    if not (config.alerting.enabled and sink.enabled):
        return None

    async def follow() -> None:
        try:
            await follow_alerts(config.kafka.bootstrap_servers, sink.topic, feed, stop)
        except Exception as exc:  # the screen loses its alert list; the pipeline is unaffected
            log.warning("demo.alert_feed_failed", error_type=type(exc).__name__, error=str(exc)[:200])

    return asyncio.create_task(follow(), name="demo-alert-feed")


async def _cancel(app: asyncio.Task[None]) -> None:
    """Cancel the pipeline and wait for it, but not forever: a task that ignores its cancellation
    must not hang the demo (its outcome is not raised here; the caller has reported it)."""
    if app.done():
        return
    app.cancel()
    await asyncio.wait({app}, timeout=STOP_TIMEOUT_SECONDS)
    if not app.done():
        log.error("demo.pipeline_ignored_cancellation", seconds=STOP_TIMEOUT_SECONDS)
    elif not app.cancelled():
        app.exception()  # retrieved: asyncio would otherwise log it as never retrieved


async def _wait_stop_or_app(stop: asyncio.Event, app: asyncio.Task[None]) -> None:
    stopper = asyncio.create_task(stop.wait())
    try:
        await asyncio.wait({stopper, app}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopper.cancel()


def _display(registry: CollectorRegistry, **kwargs: Any) -> DemoDisplay:
    from sidecar.tools.demo.display import DemoDisplay  # rich: imported when the demo runs

    return DemoDisplay(registry, **kwargs)


async def _wait_ready(ready: asyncio.Event, stop: asyncio.Event, app: asyncio.Task[None], display: DemoDisplay) -> bool:
    """True once the pipeline is ready (or slow to say so); False if it ended or Ctrl-C came first."""
    waiters = {asyncio.create_task(ready.wait()), asyncio.create_task(stop.wait())}
    try:
        await asyncio.wait({*waiters, app}, timeout=READY_TIMEOUT_SECONDS, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()
    if app.done() or stop.is_set():
        return False
    if not ready.is_set():
        display.note(f"the sidecar is not ready after {READY_TIMEOUT_SECONDS:.0f} s; replaying anyway")
    return True


async def _finish(app: asyncio.Task[None], stop: asyncio.Event, display: DemoDisplay) -> int:
    """Stop the pipeline, print the final counters, and turn its outcome into an exit code."""
    unexpected = app.done() and not stop.is_set()
    stop.set()
    try:
        async with asyncio.timeout(STOP_TIMEOUT_SECONDS):
            await asyncio.shield(app)
    except TimeoutError:
        display.note(f"the sidecar did not stop within {STOP_TIMEOUT_SECONDS:.0f} s; cancelling it")
        await _cancel(app)
        return EXIT_FAILURE
    except Exception as exc:
        display.note(f"sidecar demo: the sidecar failed: {exc!r}")
        log.exception("demo.pipeline_failed", error_type=type(exc).__name__)
        return EXIT_FAILURE
    display.final()
    if unexpected:
        display.note("sidecar demo: the sidecar stopped on its own before the demo ended")
        return EXIT_FAILURE
    return EXIT_OK


__all__ = ["Pipeline", "add_demo_parser", "demo_events", "run_demo"]
