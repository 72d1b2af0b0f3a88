"""The OpenAI-compatible embeddings client and the embedding helpers (fast, fake transport)."""

from __future__ import annotations

import json
from collections.abc import Callable

import httpx
import numpy as np
import pytest

from sidecar.clustering.config import ClusteringEmbeddingConfig
from sidecar.clustering.embed import (
    OpenAIEmbeddingsEmbedder,
    SentenceTransformerEmbedder,
    build_embedder,
    normalize_rows,
)
from sidecar.errors import PermanentError, RetryableError


def client(handler: Callable[[httpx.Request], httpx.Response]) -> OpenAIEmbeddingsEmbedder:
    cfg = ClusteringEmbeddingConfig(backend="openai", batch_size=2, api_key="s3cret")
    http = httpx.Client(base_url="http://emb.test/v1", transport=httpx.MockTransport(handler))
    return OpenAIEmbeddingsEmbedder(cfg, client=http)


def ok(req: httpx.Request) -> httpx.Response:
    texts = json.loads(req.content)["input"]
    data = [{"index": i, "embedding": [float(len(t)), 1.0, 0.0]} for i, t in enumerate(texts)]
    return httpx.Response(200, json={"data": list(reversed(data))})  # order restored by index


def test_batches_order_and_normalisation() -> None:
    seen: list[list[str]] = []

    def handler(req: httpx.Request) -> httpx.Response:
        seen.append(json.loads(req.content)["input"])
        return ok(req)

    vecs = client(handler).embed(["a", "bbb", "", "x" * 10_000, "cc"])
    assert [len(b) for b in seen] == [2, 2, 1]
    assert seen[1][0] == " " and len(seen[1][1]) == 4000  # empty text padded, long text clipped
    assert vecs.shape == (5, 3)
    assert np.allclose(np.linalg.norm(vecs, axis=1), 1.0)
    assert vecs[1, 0] > vecs[0, 0]


@pytest.mark.parametrize(
    ("response", "error"),
    [
        (httpx.Response(503), RetryableError),
        (httpx.Response(429), RetryableError),
        (httpx.Response(400, json={"error": "bad"}), PermanentError),
        (httpx.Response(200, content=b"not json"), PermanentError),
        (httpx.Response(200, json={"data": [{"index": 0}]}), PermanentError),
        (httpx.Response(200, json={"data": []}), PermanentError),
        (httpx.Response(200, json={"data": [{"index": 0, "embedding": ["nan", 1]}]}), PermanentError),
    ],
)
def test_bad_answers_raise_classified_errors(response: httpx.Response, error: type[Exception]) -> None:
    with pytest.raises(error):
        client(lambda req: response).embed(["a"])


def test_connection_failure_is_retryable() -> None:
    def refuse(req: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=req)

    with pytest.raises(RetryableError):
        client(refuse).embed(["a"])


def test_helpers() -> None:
    assert client(ok).embed([]).shape[0] == 0
    rows = normalize_rows(np.array([[3.0, 4.0], [0.0, 0.0]]))
    assert np.allclose(rows, [[0.6, 0.8], [0.0, 0.0]]) and rows.dtype == np.float32
    with pytest.raises(ValueError, match="2-d"):
        normalize_rows(np.zeros(3))
    assert isinstance(build_embedder(ClusteringEmbeddingConfig()), SentenceTransformerEmbedder)
    assert isinstance(build_embedder(ClusteringEmbeddingConfig(backend="openai")), OpenAIEmbeddingsEmbedder)
