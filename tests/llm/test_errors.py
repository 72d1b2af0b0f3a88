"""The one classification: retryable vs permanent, decided from openai/httpx exceptions."""

from __future__ import annotations

import asyncio

import httpx
import openai
import pytest

from sidecar.errors import PermanentError, RetryableError, SidecarError
from sidecar.llm.errors import LlmRequestError, classify

REQUEST = httpx.Request("POST", "http://llm.test/v1/chat/completions")


def status_error(status: int, message: str = "nope") -> openai.APIStatusError:
    response = httpx.Response(status, json={"error": {"message": message}}, request=REQUEST)
    return openai.APIStatusError(message, response=response, body=None)


@pytest.mark.parametrize(
    ("exc", "verdict", "reason"),
    [
        (status_error(500), "retryable", None),
        (status_error(502), "retryable", None),
        (status_error(503), "retryable", None),
        (status_error(599), "retryable", None),
        (status_error(408), "retryable", None),
        (status_error(409), "retryable", None),
        (status_error(429), "retryable", None),
        (status_error(400), "permanent", "http_400"),
        (status_error(401), "permanent", "http_401"),
        (status_error(403), "permanent", "http_403"),
        (status_error(404), "permanent", "http_404"),
        (status_error(422), "permanent", "http_422"),
        (status_error(400, "This model's Maximum Context Length is 2048 tokens"), "permanent", "prompt_too_long"),
        (openai.APIConnectionError(request=REQUEST), "retryable", None),
        (openai.APITimeoutError(request=REQUEST), "retryable", None),
        (httpx.ConnectError("refused", request=REQUEST), "retryable", None),
        (httpx.ReadTimeout("slow", request=REQUEST), "retryable", None),
        (httpx.RemoteProtocolError("cut", request=REQUEST), "retryable", None),
        (openai.APIResponseValidationError(httpx.Response(200, request=REQUEST), None), "permanent", "bad_response"),
        (ValueError("Expecting value: line 1 column 1"), "permanent", "bad_response"),
        (RetryableError("already decided"), None, None),
        (PermanentError("already decided"), None, None),
        (LlmRequestError("bad_response", "parsed by the caller"), None, None),
        (RuntimeError("a bug"), None, None),
        (KeyError("a bug"), None, None),
    ],
    ids=lambda v: type(v).__name__ if isinstance(v, BaseException) else str(v),
)
def test_classification_table(exc: BaseException, verdict: str | None, reason: str | None) -> None:
    got = classify(exc)
    if verdict is None:
        assert got is None
        return
    assert got is not None
    assert isinstance(got, SidecarError)
    if verdict == "retryable":
        assert isinstance(got, RetryableError) and not isinstance(got, PermanentError)
    else:
        assert isinstance(got, LlmRequestError) and isinstance(got, PermanentError)
        assert got.reason == reason


def test_a_refusal_keeps_its_status() -> None:
    got = classify(status_error(404))
    assert isinstance(got, LlmRequestError) and got.status == 404
    unreadable = classify(ValueError("x"))
    assert isinstance(unreadable, LlmRequestError) and unreadable.status is None


def test_cancellation_is_never_classified() -> None:
    assert classify(asyncio.CancelledError()) is None
    assert classify(KeyboardInterrupt()) is None
