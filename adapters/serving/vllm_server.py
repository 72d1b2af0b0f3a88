"""Start and stop a real vLLM OpenAI-compatible server (the sidecar's launcher, synchronously)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from types import TracebackType

import structlog

from sidecar.tools.local_vllm import LocalVllmServer, LocalVllmSpec

log = structlog.get_logger()


class VllmServer:
    """A vLLM api_server child process serving ``model_dir`` as ``base`` plus LoRA modules.

    A synchronous wrapper (``with VllmServer(...) as server:``) around the sidecar's
    :class:`~sidecar.tools.local_vllm.LocalVllmServer`, so training and serving start vLLM the
    same way.
    """

    def __init__(
        self,
        model_dir: Path,
        lora_modules: Mapping[str, Path],
        log_path: Path,
        *,
        port: int = 0,
        max_model_len: int = 1024,
        max_lora_rank: int = 8,
        max_logprobs: int = 20,
        startup_timeout_seconds: float = 900.0,
    ) -> None:
        spec = LocalVllmSpec(
            model_dir=model_dir,
            lora_modules=dict(lora_modules),
            max_model_len=max_model_len,
            max_lora_rank=max_lora_rank,
            max_logprobs=max_logprobs,
            port=port,  # 0: the launcher picks one (and picks again if it is taken meanwhile)
            max_loras=len(lora_modules) or None,
        )
        self._server = LocalVllmServer(spec, log_path)
        self._timeout = startup_timeout_seconds

    @property
    def port(self) -> int:
        """The port served on; known once :meth:`start` returned when the spec left it to pick."""
        return self._server.port

    @property
    def base_url(self) -> str:
        return self._server.root_url

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
