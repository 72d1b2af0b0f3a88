"""vLLM down and slow, for real: a proxy in front of the real server is cut and restored.

Proven: while vLLM is unreachable or too slow, scoring awaitables stay pending (backpressure: the
processor's bounded pending-effect set fills and Kafka is paused) instead of failing; readiness
turns false; when vLLM is back every pending score completes (nothing lost); concurrency stays
bounded throughout.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from sidecar.contract import TurnContext
from sidecar.scoring.config import ScoringConfig
from sidecar.scoring.hooks import ScoringHooks
from tests.scoring.conversations import CONVERSATIONS
from tests.scoring.proxy import ToggleProxy
from tests.support.vllm_server import VllmServer


@pytest.fixture
async def proxy(vllm_server: VllmServer) -> AsyncIterator[ToggleProxy]:
    host, port = vllm_server.root_url.removeprefix("http://").split(":")
    p = ToggleProxy(host, int(port))
    yield p
    await p.down()


def _hooks(vllm_server: VllmServer, url: str, **vllm: Any) -> tuple[ScoringHooks, CollectorRegistry]:
    cfg = ScoringConfig(
        enabled=True,
        tokenizer={"model_dir": str(vllm_server.model_dir)},
        agents={"booking": {"adapter": vllm_server.adapter_model}},
        tree={"alpha": 0.1, "max_depth_tokens": 8},
        vllm={
            "base_url": url,
            "base_model": vllm_server.base_model,
            "max_attempts": 2,
            "retry_initial_backoff_seconds": 0.05,
            "retry_max_backoff_seconds": 0.2,
            "breaker_failure_threshold": 2,
            "breaker_reset_seconds": 0.3,
            "outage_poll_max_seconds": 0.5,
            "health_check_interval_seconds": 0.2,
            "connect_timeout_seconds": 1.0,
            **vllm,
        },
    )
    registry = CollectorRegistry()
    return ScoringHooks.from_config(cfg, registry), registry


def _contexts() -> list[TurnContext]:
    out = []
    for i, conv in enumerate(CONVERSATIONS * 2):
        out.append(TurnContext("turn_closed", f"c{i}", 1, conv, "booking", None))
        out.append(TurnContext("user_message", f"c{i}", 1, conv, "booking", None))
    return out


async def _fire(hooks: ScoringHooks, ctxs: list[TurnContext]) -> list[asyncio.Task[Any]]:
    tasks = []
    for ctx in ctxs:
        aw = hooks.on_turn_closed(ctx) if ctx.kind == "turn_closed" else hooks.on_user_message(ctx)
        assert inspect.isawaitable(aw)
        tasks.append(asyncio.ensure_future(aw))
    return tasks


async def test_vllm_down_means_waiting_then_everything_completes(vllm_server: VllmServer, proxy: ToggleProxy) -> None:
    hooks, registry = _hooks(vllm_server, proxy.url)
    await hooks.start()
    try:
        tasks = await _fire(hooks, _contexts())
        await asyncio.sleep(2.0)
        assert not any(t.done() for t in tasks)  # pending, not failed
        assert not hooks.health().ready
        assert registry.get_sample_value("sidecar_vllm_up") == 0
        # Both kinds go through the waiting path. How soon each gets its first refusal depends on
        # the breaker's half-open probe order (one request at a time), so wait for it, bounded.
        for kind in ("completion", "tree"):
            for _ in range(300):
                if (registry.get_sample_value("sidecar_scoring_backpressure_waits_total", {"kind": kind}) or 0) > 0:
                    break
                await asyncio.sleep(0.1)
            assert (registry.get_sample_value("sidecar_scoring_backpressure_waits_total", {"kind": kind}) or 0) > 0
        assert not any(t.done() for t in tasks)  # still pending after all those refusals
        await proxy.up()
        outcomes = await asyncio.wait_for(asyncio.gather(*tasks), timeout=120)
        assert all("error" not in o and "skipped" not in o for o in outcomes)
        assert all(("p_end" in o) or ("leaves" in o) for o in outcomes)
        for _ in range(50):
            if hooks.health().ready:
                break
            await asyncio.sleep(0.1)
        assert hooks.health().ready
    finally:
        await hooks.stop()


async def test_vllm_going_down_mid_flight_and_slow_responses(vllm_server: VllmServer, proxy: ToggleProxy) -> None:
    # mixed_batches shared: with auto, the mixed-batch self-test's base requests would meet the
    # outage before any adapter request does, and this test counts the adapter's own failures.
    hooks, registry = _hooks(
        vllm_server, proxy.url, request_timeout_seconds=1.0, max_concurrency=2, mixed_batches="shared"
    )
    await proxy.up()
    proxy.delay_seconds = 3.0  # slower than the request timeout: every attempt times out
    await hooks.start()
    try:
        tasks = await _fire(hooks, _contexts())
        peak = 0.0
        for _ in range(20):
            await asyncio.sleep(0.1)
            peak = max(peak, registry.get_sample_value("sidecar_vllm_requests_in_flight") or 0)
        assert not any(t.done() for t in tasks)
        await proxy.down()  # and now it is gone altogether
        await asyncio.sleep(0.5)
        proxy.delay_seconds = 0.0
        await proxy.up()
        outcomes = await asyncio.wait_for(asyncio.gather(*tasks), timeout=120)
        assert all("error" not in o for o in outcomes)
        assert peak <= 2
        errors = registry.get_sample_value(
            "sidecar_vllm_request_errors_total", {"model": vllm_server.adapter_model, "kind": "retryable"}
        )
        assert errors is not None
        assert errors > 0
    finally:
        await hooks.stop()


async def test_cancelling_a_waiting_score_leaves_nothing_behind(vllm_server: VllmServer, proxy: ToggleProxy) -> None:
    hooks, registry = _hooks(vllm_server, proxy.url)
    tasks = await _fire(hooks, _contexts()[:2])
    await asyncio.sleep(0.5)
    for t in tasks:
        t.cancel()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert all(isinstance(r, asyncio.CancelledError) for r in results)
    assert registry.get_sample_value("sidecar_vllm_requests_in_flight") == 0
    await hooks.stop()
