"""One error classification for every OpenAI-compatible endpoint: retryable or permanent.

:func:`classify` decides once, at the boundary, from the ``openai``/``httpx`` exception:

==============================================================  ==========================================
exception                                                       verdict
==============================================================  ==========================================
HTTP 5xx, 408, 409, 429 (``openai.APIStatusError``)              retryable
other HTTP 4xx                                                   permanent, ``reason`` ``http_<status>``
HTTP 4xx saying "maximum context length"                         permanent, ``reason`` ``prompt_too_long``
connection refused/reset, timeout (``openai.APIConnectionError``,  retryable
``openai.APITimeoutError``, ``httpx.TransportError``)
a body the SDK cannot read (other ``openai.APIError``,            permanent, ``reason`` ``bad_response``
``ValueError`` from its JSON decoder)
a :class:`~sidecar.errors.SidecarError` (already decided)        ``None``: passed on unchanged
anything else (a bug, cancellation)                              ``None``: passed on unchanged
==============================================================  ==========================================

408, 409 and 429 are the statuses the ``openai`` SDK's own retry policy retries (which is off
here: ``max_retries=0``, so retries never stack).
"""

from __future__ import annotations

import httpx
import openai

from sidecar.errors import PermanentError, RetryableError, SidecarError

RETRYABLE_STATUS = frozenset({408, 409, 429})


class LlmUnavailable(RetryableError):
    """The endpoint could not be reached within one call's retry budget."""


class LlmRequestError(PermanentError):
    """The endpoint refused the request (4xx) or answered with something unreadable.

    ``reason`` is a short stable identifier (``http_400``, ``prompt_too_long``, ``bad_response``);
    ``status`` the HTTP status when there was one.
    """

    def __init__(self, reason: str, detail: str, status: int | None = None) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail
        self.status = status


def classify(exc: BaseException) -> RetryableError | LlmRequestError | None:
    """The retryable/permanent verdict on ``exc`` (see the module's table); None: not ours to judge."""
    if isinstance(exc, SidecarError):
        return None
    if isinstance(exc, openai.APIStatusError):
        status = exc.status_code
        if status >= 500 or status in RETRYABLE_STATUS:
            return RetryableError(f"status {status}")
        reason = "prompt_too_long" if "maximum context length" in str(exc).lower() else f"http_{status}"
        return LlmRequestError(reason, f"the endpoint refused the request with status {status}", status)
    if isinstance(exc, openai.APIConnectionError | httpx.TransportError):  # APITimeoutError included
        return RetryableError(type(exc).__name__)
    if isinstance(exc, openai.APIError | ValueError):
        return LlmRequestError("bad_response", type(exc).__name__)
    return None
