"""VllmClient's retry layer, breaker, error mapping and parsing, on a mock transport."""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Callable

import httpx
import pytest
from prometheus_client import CollectorRegistry

from sidecar.errors import PermanentError
from sidecar.llm.breaker import CircuitBreaker
from sidecar.scoring.client import (
    VllmClient,
    VllmRequestError,
    VllmUnavailable,
    logprob,
    parse_choice,
)
from sidecar.scoring.config import VllmEndpointConfig


def _ok(prompts: int = 1) -> dict[str, object]:
    choice = {
        "text": "ab",
        "finish_reason": "length",
        "logprobs": {
            "tokens": ["token_id:5", "token_id:7"],
            "token_logprobs": [-0.1, -0.2],
            "top_logprobs": [{"token_id:5": -0.1, "token_id:9": -2.5}, {"token_id:7": -0.2}],
        },
    }
    return {
        "choices": [{**choice, "index": i} for i in reversed(range(prompts))],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2 * prompts, "total_tokens": 3 + 2 * prompts},
    }


def _client(handler: Callable[[httpx.Request], httpx.Response], **cfg: object) -> tuple[VllmClient, CollectorRegistry]:
    # mixed_batches shared: these tests are about single requests; the self-test has its own tests.
    base = {"base_url": "http://vllm.test/v1", "max_attempts": 3, "retry_initial_backoff_seconds": 0.001,
            "retry_max_backoff_seconds": 0.002, "breaker_failure_threshold": 100,
            "mixed_batches": "shared"}  # fmt: skip
    registry = CollectorRegistry()
    config = VllmEndpointConfig(**{**base, **cfg})
    http = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    return VllmClient(config, registry, http_client=http), registry


async def test_request_shape_and_parsing() -> None:
    seen: list[dict[str, object]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(json.loads(request.content))
        return httpx.Response(200, json=_ok(2))

    client, registry = _client(handler)
    out = await client.generate("completion", [[1, 2], [3]], max_tokens=2, top_logprobs=50, stop_token_ids=[1])
    body = seen[0]
    assert body["prompt"] == [[1, 2], [3]]
    assert body["model"] == "completion"
    assert body["return_tokens_as_token_ids"] is True
    assert body["temperature"] == 0.0
    assert body["logprobs"] == 20  # capped at the server's max_logprobs
    assert body["stop_token_ids"] == [1]
    assert out[0].token_ids == (5, 7)
    assert out[0].top_logprobs[0] == {5: -0.1, 9: -2.5}
    assert registry.get_sample_value("sidecar_vllm_generated_tokens_total", {"model": "completion"}) == 4
    assert registry.get_sample_value("sidecar_vllm_prompt_tokens_total", {"model": "completion"}) == 3


async def test_retryable_errors_are_retried_by_one_layer_only() -> None:
    calls = 0

    def handler(request: httpx.Request) -> httpx.Response:
        nonlocal calls
        calls += 1
        return httpx.Response(503 if calls < 3 else 200, json=_ok() if calls >= 3 else {"error": "busy"})

    client, registry = _client(handler)
    out = await client.generate("base", [[1]], max_tokens=2, top_logprobs=1)
    assert out[0].token_ids == (5, 7)
    assert calls == 3  # the openai client's own retries are off: exactly our attempts
    assert registry.get_sample_value("sidecar_vllm_request_errors_total", {"model": "base", "kind": "retryable"}) == 2


async def test_attempts_are_bounded() -> None:
    calls = 0

    def handler(request: httpx.Request) -> httpx.Response:
        nonlocal calls
        calls += 1
        raise httpx.ConnectError("refused")

    client, _ = _client(handler, max_attempts=4)
    with pytest.raises(VllmUnavailable):
        await client.generate("base", [[1]], max_tokens=1, top_logprobs=1)
    assert calls == 4


@pytest.mark.parametrize(("status", "reason"), [(400, "http_400"), (404, "http_404"), (401, "http_401")])
async def test_client_errors_are_permanent_and_not_retried(status: int, reason: str) -> None:
    calls = 0

    def handler(request: httpx.Request) -> httpx.Response:
        nonlocal calls
        calls += 1
        return httpx.Response(status, json={"error": {"message": "nope"}})

    client, _ = _client(handler)
    with pytest.raises(VllmRequestError) as info:
        await client.generate("base", [[1]], max_tokens=1, top_logprobs=1)
    assert info.value.reason == reason
    assert calls == 1


async def test_prompt_too_long_is_recognised() -> None:
    msg = "This model's maximum context length is 2048 tokens. However, you requested 5000 tokens."
    client, _ = _client(lambda r: httpx.Response(400, json={"error": {"message": msg}}))
    with pytest.raises(VllmRequestError) as info:
        await client.generate("base", [[1]], max_tokens=1, top_logprobs=1)
    assert info.value.reason == "prompt_too_long"


@pytest.mark.parametrize(
    "body",
    [
        {"choices": [{"index": 0, "logprobs": None}]},
        {"choices": [{"index": 0, "logprobs": {"tokens": ["5"], "token_logprobs": [0.0], "top_logprobs": [{}]}}]},
        {"choices": [{"index": 0, "logprobs": {"tokens": ["token_id:5"], "token_logprobs": [], "top_logprobs": []}}]},
        {"choices": []},
    ],
)
async def test_malformed_responses_are_permanent(body: dict[str, object]) -> None:
    client, _ = _client(lambda r: httpx.Response(200, json=body))
    with pytest.raises(PermanentError):
        await client.generate("base", [[1]], max_tokens=1, top_logprobs=1)


def _one_token(token_logprob: str, top: str = "{}") -> bytes:
    return (
        '{"choices": [{"index": 0, "logprobs": {"tokens": ["token_id:5"], '
        f'"token_logprobs": [{token_logprob}], "top_logprobs": [{top}]}}}}]}}'
    ).encode()


@pytest.mark.parametrize(
    "raw",
    [
        _one_token("NaN"),
        _one_token("Infinity"),
        _one_token("5.0"),
        _one_token("-0.1", '{"token_id:7": NaN}'),
        _one_token('"-0.1"'),
        _one_token("true"),
    ],
)
async def test_logprobs_out_of_range_are_bad_responses(raw: bytes) -> None:
    """NaN, +inf, positive or non-numeric logprobs never reach P(end): the response is refused."""
    headers = {"content-type": "application/json"}
    client, _ = _client(lambda r: httpx.Response(200, content=raw, headers=headers))
    with pytest.raises(VllmRequestError) as info:
        await client.generate("base", [[1]], max_tokens=1, top_logprobs=1)
    assert info.value.reason == "bad_response"


def test_logprob_accepts_float_noise_and_minus_infinity() -> None:
    assert logprob(1e-7) == 0.0
    assert logprob(-math.inf) == -math.inf
    assert logprob(-9999) == -9999.0


def test_parse_choice_rejects_string_keys() -> None:
    with pytest.raises(VllmRequestError):
        parse_choice({"logprobs": {"tokens": ["ab"], "token_logprobs": [0.0], "top_logprobs": [None]}})


async def test_breaker_opens_then_waits_and_recovers() -> None:
    up = False
    calls = 0

    def handler(request: httpx.Request) -> httpx.Response:
        nonlocal calls
        calls += 1
        if not up:
            raise httpx.ConnectError("refused")
        return httpx.Response(200, json=_ok())

    client, registry = _client(handler, breaker_failure_threshold=2, breaker_reset_seconds=0.2, max_attempts=2)
    with pytest.raises(VllmUnavailable):
        await client.generate("base", [[1]], max_tokens=1, top_logprobs=1)
    assert client.breaker.state == "open"
    assert not client.health().ready
    assert registry.get_sample_value("sidecar_vllm_circuit_breaker_state") == 2
    before = calls
    # While open, a call waits (no request is sent) until the reset time, then probes.
    up = True
    out = await asyncio.wait_for(client.generate("base", [[1]], max_tokens=1, top_logprobs=1), timeout=5)
    assert out[0].token_ids == (5, 7)
    assert calls == before + 1
    assert client.health().detail == "not probed yet"  # breaker closed again: no "breaker open" note


async def test_concurrency_is_bounded() -> None:
    in_flight = 0
    peak = 0

    async def slow(request: httpx.Request) -> httpx.Response:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        await asyncio.sleep(0.02)
        in_flight -= 1
        return httpx.Response(200, json=_ok())

    registry = CollectorRegistry()
    config = VllmEndpointConfig(base_url="http://vllm.test/v1", max_concurrency=3)
    client = VllmClient(config, registry, http_client=httpx.AsyncClient(transport=httpx.MockTransport(slow)))
    await asyncio.gather(*(client.generate("base", [[i]], max_tokens=1, top_logprobs=1) for i in range(12)))
    assert peak == 3


async def test_cancellation_propagates_and_releases_the_slot() -> None:
    async def hang(request: httpx.Request) -> httpx.Response:
        await asyncio.sleep(60)
        return httpx.Response(200, json=_ok())

    config = VllmEndpointConfig(base_url="http://vllm.test/v1", max_concurrency=1)
    client = VllmClient(config, CollectorRegistry(), http_client=httpx.AsyncClient(transport=httpx.MockTransport(hang)))
    task = asyncio.create_task(client.generate("base", [[1]], max_tokens=1, top_logprobs=1))
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert client.metrics.in_flight._value.get() == 0


async def test_health_probe_reflects_vllm() -> None:
    status = 200

    def handler(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/health"
        return httpx.Response(status)

    client, registry = _client(handler)
    assert not client.health().ready  # never probed
    assert await client.probe()
    assert client.health().ready
    status = 503
    assert not await client.probe()
    assert not client.health().ready
    assert registry.get_sample_value("sidecar_vllm_up") == 0
    await client.stop()
    await client.stop()  # idempotent


@pytest.mark.parametrize("isolate", [True, False])
async def test_prompt_logprobs_requests_run_alone(isolate: bool) -> None:
    """vLLM CPU crashes on a LoRA prompt_logprobs request batched with others: they go alone."""
    active: list[str] = []
    overlaps: list[tuple[str, ...]] = []

    async def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        kind = "plp" if "prompt_logprobs" in body else "gen"
        active.append(kind)
        if "plp" in active and len(active) > 1:
            overlaps.append(tuple(active))
        await asyncio.sleep(0.03)
        active.remove(kind)
        if kind == "plp":
            rows = [None, {"2": {"logprob": -1.5}}]
            return httpx.Response(200, json={"choices": [{"index": 0, "prompt_logprobs": rows}]})
        return httpx.Response(200, json=_ok())

    config = VllmEndpointConfig(
        base_url="http://vllm.test/v1", max_concurrency=8, isolate_prompt_logprobs=isolate, mixed_batches="shared"
    )
    client = VllmClient(
        config, CollectorRegistry(), http_client=httpx.AsyncClient(transport=httpx.MockTransport(handler))
    )
    gens = [client.generate("a", [[i]], max_tokens=1, top_logprobs=1) for i in range(6)]
    plps = [client.prompt_token_logprobs("a", [1, 2]) for _ in range(3)]
    results = await asyncio.gather(*gens[:3], *plps, *gens[3:])
    assert (overlaps == []) is isolate  # without the gate they do overlap: the test can fail
    assert results[3] == [None, -1.5]


def _state(breaker: CircuitBreaker) -> str:
    """The state, widened to str (mypy narrows a property across awaits otherwise)."""
    return breaker.state


async def test_half_open_breaker_lets_exactly_one_probe_through() -> None:
    breaker = CircuitBreaker(threshold=1, reset_seconds=0.05)
    breaker.record_failure()
    assert _state(breaker) == "open"
    admitted: list[int] = []

    async def caller(i: int) -> None:
        await breaker.acquire()
        admitted.append(i)

    tasks = [asyncio.create_task(caller(i)) for i in range(5)]
    for _ in range(100):  # the probe goes through once reset_seconds have passed (bounded wait: loaded CI)
        if admitted:
            break
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.2)  # time for any wrongly admitted second caller to show
    assert len(admitted) == 1  # the probe; the others wait for its verdict
    assert _state(breaker) == "half_open"
    breaker.record_success()
    await asyncio.wait_for(asyncio.gather(*tasks), timeout=2)
    assert sorted(admitted) == list(range(5))
    assert _state(breaker) == "closed"


async def test_failed_probe_reopens_the_breaker() -> None:
    breaker = CircuitBreaker(threshold=3, reset_seconds=0.05)
    for _ in range(3):
        breaker.record_failure()
    await asyncio.wait_for(breaker.acquire(), timeout=1)
    assert _state(breaker) == "half_open"
    breaker.record_failure()
    assert _state(breaker) == "open"
    breaker.release_probe()
    assert _state(breaker) == "open"


@pytest.mark.parametrize("raw", [b"not json", b"[]", b'{"choices": "x"}', b'{"choices": [1]}', b"\xff\xfe", b""])
async def test_unreadable_bodies_are_permanent(raw: bytes) -> None:
    headers = {"content-type": "application/json"}
    client, _ = _client(lambda r: httpx.Response(200, content=raw, headers=headers))
    with pytest.raises(VllmRequestError) as info:
        await client.generate("base", [[1]], max_tokens=1, top_logprobs=1)
    assert info.value.reason == "bad_response"
