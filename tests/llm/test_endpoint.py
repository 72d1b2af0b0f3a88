"""LlmEndpoint: bounded retry, breaker states, concurrency, observer reports, client construction."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable
from typing import Any

import httpx
import openai
import pytest

from sidecar.llm.breaker import CircuitBreaker
from sidecar.llm.config import LlmEndpointConfig
from sidecar.llm.endpoint import CallObserver, Failure, LlmEndpoint, openai_client
from sidecar.llm.errors import LlmRequestError, LlmUnavailable

REQUEST = httpx.Request("POST", "http://llm.test/v1/completions")


def status_error(status: int) -> openai.APIStatusError:
    return openai.APIStatusError("x", response=httpx.Response(status, request=REQUEST), body=None)


def endpoint(**cfg: Any) -> LlmEndpoint:
    base: dict[str, Any] = {"base_url": "http://llm.test/v1", "retry_initial_backoff_seconds": 0.01,
                            "retry_max_backoff_seconds": 0.02, "breaker_failure_threshold": 100}  # fmt: skip
    return LlmEndpoint(LlmEndpointConfig(**{**base, **cfg}))


class Recorder(CallObserver):
    def __init__(self) -> None:
        self.failures: list[Failure] = []

    def failed(self, failure: Failure) -> None:
        self.failures.append(failure)


def failing(*errors: BaseException, then: Any = "ok") -> tuple[Callable[[], Any], list[float]]:
    """A send() raising ``errors`` in turn, then returning ``then``; records when each attempt ran."""
    times: list[float] = []
    queue = list(errors)

    async def send() -> Any:
        times.append(time.monotonic())
        if queue:
            raise queue.pop(0)
        return then

    return send, times


async def test_retryable_failures_are_retried_then_succeed() -> None:
    send, times = failing(status_error(503), openai.APIConnectionError(request=REQUEST))
    rec = Recorder()
    assert await endpoint(max_attempts=3).call(send, rec) == "ok"
    assert len(times) == 3
    assert [(f.kind, f.attempts, f.final) for f in rec.failures] == [("retryable", 1, False), ("retryable", 2, False)]


async def test_attempts_are_bounded_then_unavailable() -> None:
    send, times = failing(*(status_error(429) for _ in range(10)))
    rec = Recorder()
    with pytest.raises(LlmUnavailable, match="4 attempts"):
        await endpoint(max_attempts=4).call(send, rec)
    assert len(times) == 4
    assert [f.final for f in rec.failures] == [False, False, False, True]


async def test_waits_between_attempts_follow_the_backoff_bounds() -> None:
    send, times = failing(*(status_error(500) for _ in range(4)))
    with pytest.raises(LlmUnavailable):
        await endpoint(max_attempts=4, retry_initial_backoff_seconds=0.05, retry_max_backoff_seconds=0.08).call(send)
    gaps = [b - a for a, b in itertools.pairwise(times)]
    # nominal 0.05, 0.08 (capped), 0.08: each wait is at least half of it (scheduling only adds)
    assert gaps[0] >= 0.025 and gaps[1] >= 0.04 and gaps[2] >= 0.04
    assert sum(gaps) < 5


async def test_elapsed_budget_stops_retrying_before_max_attempts() -> None:
    send, times = failing(*(status_error(500) for _ in range(20)))
    ep = endpoint(max_attempts=20, retry_initial_backoff_seconds=0.1, retry_max_backoff_seconds=0.1,
                  retry_max_elapsed_seconds=0.12)  # fmt: skip
    with pytest.raises(LlmUnavailable):
        await ep.call(send)
    assert 2 <= len(times) <= 4


async def test_permanent_failures_raise_the_users_type_at_once() -> None:
    class Refused(LlmRequestError):
        pass

    send, times = failing(status_error(400))
    rec = Recorder()
    ep = LlmEndpoint(LlmEndpointConfig(base_url="http://llm.test/v1"), refused=Refused)
    with pytest.raises(Refused) as info:
        await ep.call(send, rec)
    assert info.value.reason == "http_400" and info.value.status == 400
    assert len(times) == 1 and rec.failures[0].kind == "permanent" and rec.failures[0].final
    assert ep.breaker.state == "closed"


async def test_unclassified_errors_propagate_unchanged_and_unreported() -> None:
    send, _ = failing(RuntimeError("bug"))
    rec = Recorder()
    with pytest.raises(RuntimeError, match="bug"):
        await endpoint().call(send, rec)
    assert rec.failures == []


async def test_breaker_opens_and_calls_wait_for_its_probe() -> None:
    ep = endpoint(max_attempts=2, breaker_failure_threshold=2, breaker_reset_seconds=0.2)
    send, _ = failing(status_error(503), status_error(503))
    with pytest.raises(LlmUnavailable):
        await ep.call(send)
    assert ep.breaker.state == "open"
    send, times = failing()
    started = time.monotonic()
    assert await asyncio.wait_for(ep.call(send), timeout=5) == "ok"
    assert times[0] - started >= 0.1  # waited for the reset time before the probe was sent
    assert ep.breaker.state == "closed"


async def test_attempt_context_wraps_the_request_only() -> None:
    events: list[str] = []

    class Timing(CallObserver):
        def attempt(self) -> Any:
            class Ctx:
                def __enter__(self) -> None:
                    events.append("enter")

                def __exit__(self, *exc: object) -> None:
                    events.append("exit")

            return Ctx()

    send, _ = failing(status_error(502))
    await endpoint(max_attempts=2).call(send, Timing())
    assert events == ["enter", "exit", "enter", "exit"]


async def test_concurrency_is_bounded_across_retries() -> None:
    in_flight = peak = 0

    async def send() -> str:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        await asyncio.sleep(0.01)
        in_flight -= 1
        return "ok"

    ep = endpoint(max_concurrency=3)
    await asyncio.gather(*(ep.call(send) for _ in range(12)))
    assert peak == 3


async def test_cancellation_propagates_and_frees_the_probe() -> None:
    ep = endpoint(breaker_failure_threshold=1, breaker_reset_seconds=0.01, max_attempts=1)
    with pytest.raises(LlmUnavailable):
        await ep.call(failing(status_error(500))[0])
    await asyncio.sleep(0.02)

    async def hang() -> str:
        await asyncio.sleep(60)
        return "never"

    task = asyncio.create_task(ep.call(hang))  # the half-open probe
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await asyncio.wait_for(ep.call(failing()[0]), timeout=2) == "ok"  # another probe may go


# -- breaker states -------------------------------------------------------------------------------


async def test_breaker_closed_to_open_to_half_open_to_closed() -> None:
    b = CircuitBreaker(threshold=2, reset_seconds=0.05)
    b.record_failure()
    assert b.state == "closed"
    b.record_failure()
    assert b.state == "open"
    await asyncio.wait_for(b.acquire(), timeout=1)
    assert b.state == "half_open"
    b.record_success()
    assert b.state == "closed"


async def test_a_success_resets_the_consecutive_count() -> None:
    b = CircuitBreaker(threshold=2, reset_seconds=10)
    for _ in range(5):
        b.record_failure()
        b.record_success()
    assert b.state == "closed"


async def test_threshold_zero_never_opens() -> None:
    b = CircuitBreaker(threshold=0, reset_seconds=10)
    for _ in range(1000):
        b.record_failure()
    assert b.state == "closed"
    await asyncio.wait_for(b.acquire(), timeout=1)


# -- client construction --------------------------------------------------------------------------


async def test_openai_client_has_no_retries_of_its_own_and_the_configured_timeouts() -> None:
    cfg = LlmEndpointConfig(base_url="http://llm.test/v1", request_timeout_seconds=7, connect_timeout_seconds=2)
    client = openai_client(cfg)
    assert client.max_retries == 0
    assert isinstance(client.timeout, httpx.Timeout)
    assert (client.timeout.read, client.timeout.connect) == (7, 2)
    assert str(client.base_url).rstrip("/") == "http://llm.test/v1"
    await client.close()
    no_connect = openai_client(LlmEndpointConfig(request_timeout_seconds=9))
    assert isinstance(no_connect.timeout, httpx.Timeout) and no_connect.timeout.connect == 9
    await no_connect.close()


async def test_the_key_is_sent_as_a_bearer_token() -> None:
    seen: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers.get("authorization", ""))
        return httpx.Response(200, json={"id": "x", "object": "list", "data": []})

    cfg = LlmEndpointConfig(base_url="http://llm.test/v1", api_key="s3cret")  # type: ignore[arg-type]
    client = openai_client(cfg, http_client=httpx.AsyncClient(transport=httpx.MockTransport(handler)))
    await client.models.list()
    assert seen == ["Bearer s3cret"]
    await client.close()
