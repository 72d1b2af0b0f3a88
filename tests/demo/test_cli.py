"""``sidecar demo``: argument checking, and full runs on the mock cluster with the real pipeline."""

from __future__ import annotations

import asyncio
import gzip
import json
import os
import re
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from sidecar import cli
from sidecar.app import run_app
from sidecar.config import SidecarConfig
from sidecar.contract import TurnContext
from sidecar.state.hooks import RecordingHooks
from sidecar.tools.demo import cli as demo_cli
from sidecar.tools.demo.cli import demo_events
from sidecar.tools.demo.replay import load_sample

# Replay mechanics only: the scorers and goal clustering have tests of their own.
FAST = ["--rate", "5000", "--http-port", "0", "--scoring", "off", "--goals", "off"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--rate", "0"], "--rate must be more than 0"),
        (["--rate", "-3"], "--rate must be between"),
        (["--rate", "nan"], "--rate must be between"),
        (["--rate", "inf"], "--rate must be between"),
        (["--rate", "fast"], "--rate must be a number"),
        (["--rate", "1e9"], "--rate must be between"),
        (["--conversations", "0"], "--conversations must be between"),
        (["--conversations", "-5"], "--conversations must be between"),
        (["--conversations", "2.5"], "--conversations must be a number"),
        (["--concurrency", "0"], "--concurrency must be between"),
        (["--http-port", "70000"], "--http-port must be between"),
        (["--http-port", "-1"], "--http-port must be between"),
        (["--linger", "-1"], "--linger must be between"),
        (["--seed", "x"], "invalid int value"),
        (["--bogus"], "unrecognized arguments: --bogus"),
        (["--loop", "extra"], "unrecognized arguments: extra"),
    ],
)
def test_bad_arguments_exit_2_with_a_clear_message(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(["demo", *argv])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_help_lists_every_option(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(["demo", "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    for flag in [
        "--rate",
        "--conversations",
        "--concurrency",
        "--loop",
        "--seed",
        "--config",
        "--http-port",
        "--input",
        "--linger",
    ]:
        assert flag in out


def test_more_conversations_than_available_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["demo", "--conversations", "301", *FAST]) == 2
    assert "only 300 available" in capsys.readouterr().err


def test_missing_or_malformed_input_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["demo", "--input", str(tmp_path / "nope.jsonl.gz"), *FAST]) == 2
    assert "does not exist" in capsys.readouterr().err
    bad = tmp_path / "bad.jsonl.gz"
    bad.write_bytes(gzip.compress(b'{"conversation_id": "a", "turns": [{"role": "hacker"}]}\n'))
    assert cli.main(["demo", "--input", str(bad), *FAST]) == 2
    assert "line 1: bad message" in capsys.readouterr().err
    empty = tmp_path / "empty.jsonl.gz"
    empty.write_bytes(gzip.compress(b""))
    assert cli.main(["demo", "--input", str(empty), *FAST]) == 2
    assert "no conversations" in capsys.readouterr().err


def test_invalid_config_file_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("kafka:\n  topic: [not, a, string]\n", encoding="utf-8")
    assert cli.main(["demo", "--config", str(cfg), *FAST]) == 2
    assert "kafka.topic" in capsys.readouterr().err


def test_demo_events_rounds_use_fresh_ids() -> None:
    records = load_sample()[:3]
    once = list(demo_events(records, loop=False, concurrency=2, seed=0))
    assert len(once) == sum(len(r["turns"]) + 1 for r in records)
    stream = demo_events(records, loop=True, concurrency=2, seed=0)
    three_rounds = [next(stream) for _ in range(3 * len(once))]
    ids = {e["conversation_id"] for e in three_rounds}
    base = {r["conversation_id"] for r in records}
    assert base <= ids
    assert {f"{c}#r1" for c in base} <= ids
    assert len({e["event_id"] for e in three_rounds}) == len(three_rounds)


class _IdHooks(RecordingHooks):
    """The real no-op hook set, also remembering which conversations it saw end."""

    def __init__(self) -> None:
        super().__init__()
        self.ended: set[str] = set()

    # Returns whatever the real recorder returns; typed loosely so the test follows the hook contract.
    def on_conversation_ended(self, ctx: TurnContext) -> Any:
        self.ended.add(ctx.conversation_id)
        return super().on_conversation_ended(ctx)


def _interrupt_when(
    done: Callable[[CollectorRegistry, _IdHooks], bool], hooks: _IdHooks, timeout_seconds: float = 90.0
) -> demo_cli.Pipeline:
    """The real run_app, plus a watcher that presses Ctrl-C (SIGINT to this process) once done()."""

    async def pipeline(
        config: SidecarConfig,
        *,
        ready: asyncio.Event | None = None,
        stop: asyncio.Event | None = None,
        registry: CollectorRegistry | None = None,
    ) -> None:
        assert registry is not None

        async def watch() -> None:
            deadline = time.monotonic() + timeout_seconds
            while not done(registry, hooks) and time.monotonic() < deadline:  # noqa: ASYNC110 - polls metrics
                await asyncio.sleep(0.1)
            os.kill(os.getpid(), signal.SIGINT)

        watcher = asyncio.create_task(watch())
        try:
            await run_app(config, hooks=hooks, ready=ready, stop=stop, registry=registry)
        finally:
            watcher.cancel()

    return pipeline


def _consumed(registry: CollectorRegistry) -> float:
    return registry.get_sample_value("sidecar_events_consumed_total") or 0.0


def _run(argv: list[str], pipeline: demo_cli.Pipeline) -> int:
    args = cli.build_parser().parse_args(["demo", *argv])
    return demo_cli.run_demo(args, pipeline=pipeline)


def test_full_demo_runs_the_real_pipeline_and_stops_on_ctrl_c(capsys: pytest.CaptureFixture[str]) -> None:
    records = load_sample()[:4]
    total = sum(len(r["turns"]) + 1 for r in records)
    hooks = _IdHooks()
    pipeline = _interrupt_when(lambda reg, h: _consumed(reg) >= total and len(h.ended) == 4, hooks)
    assert _run(["--conversations", "4", "--concurrency", "3", *FAST], pipeline) == 0
    out = capsys.readouterr().out
    assert "metrics at http://127.0.0.1:" in out
    assert f"replayed all {total} events; Ctrl-C to stop" in out
    assert hooks.ended == {r["conversation_id"] for r in records}
    summary = out[out.index("sidecar demo: final summary") :]
    assert re.search(rf"events in +{total} +\(lag 0\)", summary)
    assert re.search(r"conversations +0 open, 4 ended", summary)
    assert "/escalations" in summary and "/clusters" in summary


def test_loop_replays_under_new_ids_until_ctrl_c(capsys: pytest.CaptureFixture[str]) -> None:
    hooks = _IdHooks()
    base = {r["conversation_id"] for r in load_sample()[:2]}
    second_round = {f"{c}#r1" for c in base}
    pipeline = _interrupt_when(lambda reg, h: base | second_round <= h.ended, hooks)
    assert (
        _run(
            [
                "--conversations",
                "2",
                "--loop",
                "--rate",
                "200",
                "--http-port",
                "0",
                "--scoring",
                "off",
                "--goals",
                "off",
            ],
            pipeline,
        )
        == 0
    )
    assert base | second_round <= hooks.ended
    assert all(c.split("#")[0] in base for c in hooks.ended)
    one_round = sum(len(r["turns"]) + 1 for r in load_sample()[:2])
    [replayed] = re.findall(r"replay interrupted after (\d+) events", capsys.readouterr().out)
    assert int(replayed) > 2 * one_round


def test_pipeline_failure_is_exit_1(capsys: pytest.CaptureFixture[str]) -> None:
    async def broken(config: SidecarConfig, **_: Any) -> None:
        raise RuntimeError("cannot reach vLLM")

    assert _run(["--conversations", "1", *FAST], broken) == 1
    assert "the sidecar failed: RuntimeError('cannot reach vLLM')" in capsys.readouterr().out


def test_pipeline_exiting_on_its_own_is_exit_1(capsys: pytest.CaptureFixture[str]) -> None:
    async def quits(config: SidecarConfig, **_: Any) -> None:
        await asyncio.sleep(0)

    assert _run(["--conversations", "1", *FAST], quits) == 1
    assert "stopped on its own" in capsys.readouterr().out


def test_slow_to_ready_pipeline_still_gets_the_events(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    monkeypatch.setattr(demo_cli, "READY_TIMEOUT_SECONDS", 0.2)
    seen: list[SidecarConfig] = []
    production = tmp_path / "prod.yaml"
    production.write_text(
        "kafka:\n  bootstrap_servers: kafka.prod:9093\n  security_protocol: SSL\n  topic: agents.prod\n",
        encoding="utf-8",
    )

    async def never_ready(
        config: SidecarConfig,
        *,
        ready: asyncio.Event | None = None,
        stop: asyncio.Event | None = None,
        registry: CollectorRegistry | None = None,
    ) -> None:
        assert stop is not None
        seen.append(config)
        await stop.wait()

    assert _run(["--conversations", "2", "--linger", "0", "--config", str(production), *FAST], never_ready) == 0
    out = capsys.readouterr().out
    assert "not ready after 0 s; replaying anyway" in out
    total = sum(len(r["turns"]) + 1 for r in load_sample()[:2])
    assert f"replayed all {total} events; stopping in 0 s" in out
    [config] = seen
    assert config.http.port > 0  # --http-port 0 was resolved to a real port before the start
    assert config.kafka.security_protocol == "PLAINTEXT"  # the mock cluster's, not the file's
    assert config.kafka.bootstrap_servers.startswith("127.0.0.1:")
    assert config.kafka.topic == "agents.prod"  # everything else comes from the file


@pytest.mark.parametrize(("config_text", "host"), [(None, "127.0.0.1"), ("http:\n  host: 0.0.0.0\n", "0.0.0.0")])
def test_demo_binds_loopback_unless_the_config_names_an_address(
    tmp_path: Path, config_text: str | None, host: str
) -> None:
    seen: list[SidecarConfig] = []

    async def quits(config: SidecarConfig, **_: Any) -> None:
        seen.append(config)

    extra: list[str] = []
    if config_text is not None:
        (tmp_path / "c.yaml").write_text(config_text, encoding="utf-8")
        extra = ["--config", str(tmp_path / "c.yaml")]
    _run(["--conversations", "1", *extra, *FAST], quits)
    [config] = seen
    assert config.http.host == host


@pytest.mark.parametrize(
    ("sig", "to_group"),
    [(signal.SIGINT, False), (signal.SIGTERM, False), (signal.SIGINT, True)],
    ids=["sigint", "sigterm", "ctrl-c-in-a-terminal"],
)
def test_real_process_stops_cleanly_on_signal(sig: signal.Signals, to_group: bool) -> None:
    """`python -m sidecar demo` as a user runs it: the signal comes from outside, exit is clean.

    Ctrl-C in a terminal signals the whole foreground process group, the demo's own helper
    processes included; the embedded broker must outlive the sidecar's drain all the same."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "sidecar",
            "demo",
            "--conversations",
            "3",
            "--rate",
            "20" if to_group else "2000",  # Ctrl-C mid-replay: events in flight as the broker is signalled
            "--http-port",
            "0",
            "--scoring",
            "off",
            "--goals",
            "off",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "SIDECAR_LOGGING__FORMAT": "json"},
        start_new_session=True,  # its own process group, as a shell gives a foreground job
    )
    try:
        assert proc.stdout is not None
        seen = ""
        wanted = "metrics at" if to_group else "replayed all"
        deadline = time.monotonic() + 120
        while wanted not in seen and time.monotonic() < deadline:
            ready, _, _ = select.select([proc.stdout], [], [], 1.0)
            if ready:
                line = proc.stdout.readline()
                if not line:
                    break
                seen += line
        assert wanted in seen
        if to_group:
            time.sleep(1.5)  # mid-replay: 77 events at 20 a second take about 4 s
            os.killpg(proc.pid, sig)
        else:
            assert "replayed all 77 events" in seen
            proc.send_signal(sig)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err[-2000:]
    assert "Traceback" not in err
    assert re.search(r"events in +\d+", out[out.index("final summary") :])
    records = [json.loads(line) for line in err.splitlines() if line.startswith("{")]
    assert records[-1]["event"] == "sidecar.stopped"
    assert [r for r in records if r["level"] in ("error", "critical")] == []


def test_ctrl_c_before_ready_stops_without_replaying(capsys: pytest.CaptureFixture[str]) -> None:
    async def slow_start(
        config: SidecarConfig,
        *,
        ready: asyncio.Event | None = None,
        stop: asyncio.Event | None = None,
        registry: CollectorRegistry | None = None,
    ) -> None:
        assert stop is not None
        asyncio.get_running_loop().call_later(0.2, os.kill, os.getpid(), signal.SIGINT)
        await stop.wait()

    assert _run(["--conversations", "1", *FAST], slow_start) == 0
    out = capsys.readouterr().out
    assert "replay" not in out
    assert "not ready" not in out


def test_scoring_on_without_a_model_is_a_usage_error(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sidecar.tools.demo import models

    monkeypatch.setattr(models, "ARTIFACTS", tmp_path)
    monkeypatch.setattr(models.scoring_unavailable_reason, "__defaults__", (tmp_path, "bundled"))
    assert cli.main(["demo", "--scoring", "on", "--http-port", "0"]) == 2
    assert "no bundled model" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["--scoring", "maybe"], ["--goals", "yes"], ["--model", "gemma-7b"]])
def test_bad_model_switches_exit_2(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as info:
        cli.main(["demo", *argv])
    assert info.value.code == 2


def test_gemma_without_its_package_or_without_scoring_is_a_usage_error(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from sidecar.tools.demo import models

    assert cli.main(["demo", "--model", "gemma3-270m", "--scoring", "off", "--http-port", "0"]) == 2
    assert "--model gemma3-270m needs scoring" in capsys.readouterr().err
    monkeypatch.setattr(models, "gemma_unavailable_reason", lambda: "the Gemma 3 270M weights are not installed")
    assert cli.main(["demo", "--model", "gemma3-270m", "--http-port", "0"]) == 2
    assert "--model gemma3-270m: the Gemma 3 270M weights are not installed" in capsys.readouterr().err
