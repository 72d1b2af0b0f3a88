"""``LlmEndpoint``: the one way the sidecar calls an OpenAI-compatible endpoint.

Guarantees:

* One client construction: :func:`openai_client` builds every ``openai.AsyncOpenAI`` of the sidecar,
  with the SDK's own retries off (``max_retries=0``) so retries never stack.
* One retry layer: :meth:`LlmEndpoint.call` classifies each failure once
  (:func:`sidecar.llm.errors.classify`); a retryable one is retried after
  :func:`sidecar.retry.backoff_delay` for at most ``max_attempts`` attempts and
  ``retry_max_elapsed_seconds``, then the endpoint's ``unavailable`` error (a
  :class:`~sidecar.llm.errors.LlmUnavailable`) is raised; a permanent one raises the endpoint's
  ``refused`` error (a :class:`~sidecar.llm.errors.LlmRequestError`) at once; anything unclassified
  (cancellation included) propagates unchanged.
* One circuit breaker (:class:`~sidecar.llm.breaker.CircuitBreaker`) per endpoint: it opens after
  ``breaker_failure_threshold`` consecutive retryable failures; while it is open, calls *wait* for
  its probe instead of hammering the endpoint. An answer, even a refusal, proves the endpoint up.
* At most ``max_concurrency`` calls are in flight (a call keeps its slot across its retries).
* Metrics and logs stay with each user (their names are part of its contract): the loop reports
  to a :class:`CallObserver` and logs nothing itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

import httpx
import openai

from sidecar.errors import RetryableError
from sidecar.llm.breaker import CircuitBreaker
from sidecar.llm.config import LlmEndpointConfig
from sidecar.llm.errors import LlmRequestError, LlmUnavailable, classify
from sidecar.retry import backoff_delay

# The openai SDK looks `httpx2` up in sys.modules on every request. When another thread imports it
# at that moment (the embedder loading its model does), the request sees a half-initialised module
# and fails with AttributeError. Importing it here, before any request is made, closes that race.
with contextlib.suppress(ImportError):
    importlib.import_module("httpx2")

T = TypeVar("T")

# The SDK wants some key; an endpoint without --api-key ignores it.
_NO_KEY = "unused"


def openai_client(config: LlmEndpointConfig, *, http_client: httpx.AsyncClient | None = None) -> openai.AsyncOpenAI:
    """The SDK client for ``config``: its timeouts, its key, and no retries of its own.

    ``http_client`` replaces the transport (tests use ``httpx.MockTransport``).
    """
    return openai.AsyncOpenAI(
        base_url=config.base_url,
        api_key=config.api_key.get_secret_value() or _NO_KEY,
        max_retries=0,
        timeout=httpx.Timeout(config.request_timeout_seconds, connect=config.connect_timeout),
        http_client=http_client,
    )


@dataclass(frozen=True, slots=True)
class Failure:
    """One failed attempt, as :meth:`CallObserver.failed` sees it."""

    error: RetryableError | LlmRequestError
    """The verdict: a retryable error, or the refusal (of the endpoint's ``refused`` type) raised next."""
    exc: BaseException
    """The exception as the SDK (or ``send``) raised it."""
    attempts: int
    """Attempts made so far, this one included."""
    final: bool
    """No retry follows: the call raises next (the refusal, or ``unavailable`` once the budget is spent)."""

    @property
    def status(self) -> int | None:
        """The HTTP status the endpoint answered with, if it answered."""
        return self.exc.status_code if isinstance(self.exc, openai.APIStatusError) else None

    @property
    def kind(self) -> str:
        """``permanent`` or ``retryable`` (a closed label set)."""
        return "permanent" if isinstance(self.error, LlmRequestError) else "retryable"


class CallObserver:
    """What one call reports while it runs; the base class ignores everything.

    Each hook is called from the call's own task; none may raise.
    """

    def attempt(self) -> contextlib.AbstractContextManager[None]:
        """Wraps each attempt's request (not the waits before it): in-flight gauges, latency."""
        return contextlib.nullcontext()

    def failed(self, failure: Failure) -> None:
        """One attempt failed with a classified error (unclassified ones propagate unreported)."""


_SILENT = CallObserver()


class LlmEndpoint:
    """One OpenAI-compatible endpoint: its SDK client, concurrency bound, breaker and retry loop."""

    def __init__(
        self,
        config: LlmEndpointConfig,
        *,
        client: openai.AsyncOpenAI | None = None,
        http_client: httpx.AsyncClient | None = None,
        unavailable: type[LlmUnavailable] = LlmUnavailable,
        refused: type[LlmRequestError] = LlmRequestError,
    ) -> None:
        """``client`` replaces the SDK client, ``http_client`` only its transport (for tests).

        ``unavailable`` and ``refused`` are the error types raised, so each user keeps its own.
        """
        self.config = config
        self.client = client or openai_client(config, http_client=http_client)
        self.breaker = CircuitBreaker(config.breaker_failure_threshold, config.breaker_reset_seconds)
        self._semaphore = asyncio.Semaphore(config.max_concurrency)
        self._unavailable = unavailable
        self._refused = refused

    async def aclose(self) -> None:
        """Close the SDK client's connections; idempotent."""
        await self.client.close()

    async def call(self, send: Callable[[], Awaitable[T]], observer: CallObserver = _SILENT) -> T:
        """``await send()`` through the concurrency bound, the breaker and the bounded retry."""
        cfg = self.config
        started = time.monotonic()
        attempt = 0
        async with self._semaphore:
            while True:
                await self.breaker.acquire()
                try:
                    with observer.attempt():
                        result = await send()
                except Exception as exc:
                    error = classify(exc)
                    if error is None:
                        self.breaker.release_probe()
                        raise
                    if isinstance(error, LlmRequestError):
                        self.breaker.record_success()  # the endpoint answered: it is up
                        refusal = self._refused(error.reason, error.detail, error.status)
                        observer.failed(Failure(refusal, exc, attempt + 1, final=True))
                        raise refusal from exc
                    self.breaker.record_failure()
                    attempt += 1
                    elapsed = time.monotonic() - started
                    final = attempt >= cfg.max_attempts or elapsed >= cfg.retry_max_elapsed_seconds
                    observer.failed(Failure(error, exc, attempt, final=final))
                    if final:
                        message = f"unavailable after {attempt} attempts over {elapsed:.1f}s: {error}"
                        raise self._unavailable(message) from exc
                except BaseException:
                    self.breaker.release_probe()
                    raise
                else:
                    self.breaker.record_success()
                    return result
                await asyncio.sleep(
                    backoff_delay(attempt, cfg.retry_initial_backoff_seconds, cfg.retry_max_backoff_seconds)
                )
