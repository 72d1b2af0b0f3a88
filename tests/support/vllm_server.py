"""The suite's one real vLLM server (CPU build), as a pytest plugin.

Fixture ``vllm_server`` (session scope) builds a tiny random-weights Llama with its tokenizer and a
LoRA adapter (:mod:`tests.support.tiny_model`), starts ONE ``vllm.entrypoints.openai.api_server``
for the whole test session, and yields a :class:`VllmServer`:

* ``base_url`` -- the OpenAI-compatible root, e.g. ``http://127.0.0.1:PORT/v1`` (give it to
  ``openai.AsyncOpenAI(base_url=..., api_key="unused")``); ``root_url`` is the same without
  ``/v1`` (``/health``, ``/metrics``, ``/tokenize``).
* ``base_model`` (``"base"``) and ``adapter_model`` (``"completion"``): the served names; the
  request's ``model`` field selects one. ``served_names`` lists both.
* ``model_dir`` / ``tokenizer_path`` / ``adapter_dir``: the checkpoint on disk. ``tokenizer_path``
  is a ``tokenizers`` ``tokenizer.json`` whose special tokens are ``<|begin_of_text|>``,
  ``<|end_of_text|>`` (eos), ``<|end_of_conversation|>`` (the completion end tag), ``<|pad|>`` and
  the Llama-3 header tokens; ``tokenizer_config.json`` holds a chat template, so
  ``/v1/chat/completions`` works (answers are nonsense: the weights are random).
* ``load_adapter(name, path)``: load another LoRA adapter at run time
  (``VLLM_ALLOW_RUNTIME_LORA_UPDATING`` is on; rank <= 8, ``q_proj``/``v_proj`` or a subset).

Server flags: ``--enable-lora --max-lora-rank 8 --enable-prefix-caching --block-size 32
--max-logprobs 20 --dtype float32 --max-model-len 2048``, ``VLLM_CPU_KVCACHE_SPACE=1`` (GiB), a free loopback port,
tcmalloc and Intel OpenMP in ``LD_PRELOAD`` where present (the launcher's default).
Start-up takes 1-2 minutes on two cores, paid once per session.

The vLLM interpreter is ``$SIDECAR_VLLM_PYTHON``, else ``$SIDECAR_VLLM_VENV/bin/python``, else
``~/.cache/sidecar/venv-vllm-0.32.0/bin/python``
(see ENVIRONMENT.md). A missing interpreter is a test *error*, never a skip.

Development shortcut: ``python -m tests.support.vllm_server serve ROOT [PORT]`` starts the same
server in the foreground; export the two lines it prints (``SIDECAR_TEST_VLLM_ROOT_URL`` and
``SIDECAR_TEST_VLLM_MODEL_ROOT``) and the fixture attaches to it instead of starting its own.

Register with ``pytest_plugins = ["tests.support.vllm_server"]`` in ``tests/conftest.py``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from sidecar.tools.local_vllm import LocalVllmServer, LocalVllmSpec
from sidecar.tools.ports import free_port
from tests.support.tiny_model import END_TAG, TinyModel

BASE_MODEL = "base"
ADAPTER_MODEL = "completion"
STARTUP_TIMEOUT_SECONDS = 420.0
BLOCK_SIZE = 32  # the CPU attention backend needs a multiple of 32
ATTACH_ROOT_URL_ENV = "SIDECAR_TEST_VLLM_ROOT_URL"
ATTACH_MODEL_ROOT_ENV = "SIDECAR_TEST_VLLM_MODEL_ROOT"


def build_model(root: Path) -> TinyModel:
    """Build the tiny model in a subprocess (keeps torch and its warnings out of this process)."""
    proc = subprocess.run(
        [sys.executable, "-W", "ignore", "-m", "tests.support.tiny_model", str(root)],
        capture_output=True,
        text=True,
        check=False,
        cwd=Path(__file__).resolve().parents[2],
        timeout=600,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"building the tiny model failed:\n{proc.stderr[-4000:]}")
    paths = json.loads(proc.stdout.strip().splitlines()[-1])
    return TinyModel(Path(paths["model_dir"]), Path(paths["adapter_dir"]), Path(paths["tokenizer_path"]))


def _http_json(url: str, body: dict[str, Any] | None = None, timeout: float = 30.0) -> Any:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        raw = resp.read()
    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode("utf-8", "replace")


@dataclass
class VllmServer:
    """A running vLLM server serving the tiny model (see the module docstring)."""

    root_url: str
    model: TinyModel
    base_model: str = BASE_MODEL
    adapter_model: str = ADAPTER_MODEL
    end_tag: str = END_TAG
    log_path: Path | None = None
    prefix_caching: bool = True
    block_size: int = BLOCK_SIZE
    _server: LocalVllmServer | None = field(default=None, repr=False)

    @property
    def base_url(self) -> str:
        return self.root_url + "/v1"

    @property
    def model_dir(self) -> Path:
        return self.model.model_dir

    @property
    def adapter_dir(self) -> Path:
        return self.model.adapter_dir

    @property
    def tokenizer_path(self) -> Path:
        return self.model.tokenizer_path

    @property
    def served_names(self) -> tuple[str, ...]:
        return (self.base_model, self.adapter_model)

    @property
    def pid(self) -> int | None:
        return None if self._server is None else self._server.pid

    def load_adapter(self, name: str, path: Path) -> None:
        """Load a LoRA adapter at run time under ``name`` (idempotent per name)."""
        try:
            _http_json(self.base_url + "/load_lora_adapter", {"lora_name": name, "lora_path": str(path)})
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode("utf-8", "replace")
            if "already" not in detail:
                raise RuntimeError(f"load_lora_adapter {name}: {exc.code} {detail}") from exc

    def metrics_text(self) -> str:
        """The raw Prometheus exposition of ``/metrics``."""
        text = _http_json(self.root_url + "/metrics")
        return text if isinstance(text, str) else json.dumps(text)

    def log_tail(self, chars: int = 4000) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        return self.log_path.read_text(encoding="utf-8", errors="replace")[-chars:]

    def stop(self) -> None:
        """Stop the server process group this object started (idempotent)."""
        if self._server is not None:
            self._server.stop()


def _wait_ready(server: VllmServer, deadline: float) -> None:
    while time.monotonic() < deadline:
        if server._server is not None and not server._server.running:
            raise RuntimeError(f"vLLM exited:\n{server.log_tail()}")
        try:
            models = _http_json(server.base_url + "/models", timeout=5)
        except (OSError, ValueError):
            time.sleep(1.0)
            continue
        names = {m["id"] for m in models.get("data", [])}
        if set(server.served_names) <= names:
            return
        time.sleep(1.0)
    raise RuntimeError(f"vLLM not ready after {STARTUP_TIMEOUT_SECONDS:.0f}s:\n{server.log_tail()}")


def max_model_len(model_dir: Path) -> int:
    """``--max-model-len``: 2048, or less if the checkpoint has fewer positions (trained artifacts)."""
    return LocalVllmSpec(model_dir=model_dir).context_length()


def start_server(
    model: TinyModel,
    log_path: Path,
    *,
    port: int | None = None,
    prefix_caching: bool = True,
    extra_args: Sequence[str] = (),
    warm_up: bool = True,
    preload: bool = True,
) -> VllmServer:
    """Start a vLLM server for ``model`` and wait until it serves both names (and warmed up).
    ``preload``: the launcher's LD_PRELOAD of tcmalloc and Intel OpenMP where present."""
    spec = LocalVllmSpec(
        model_dir=model.model_dir,
        served_name=BASE_MODEL,
        lora_modules={ADAPTER_MODEL: model.adapter_dir},
        # Small blocks: prefix-cache hits at the granularity of the tiny model's short prompts.
        block_size=BLOCK_SIZE,
        prefix_caching=prefix_caching,
        seed=0,
        port=port or 0,
        extra_args=tuple(extra_args),
        preload=preload,
    )
    local = LocalVllmServer(spec, log_path)
    local.start()
    try:
        local.wait_ready_blocking(STARTUP_TIMEOUT_SECONDS)
    except BaseException:
        local.stop()
        raise
    # The root URL is known only now: the launcher picks another port if the first was taken.
    server = VllmServer(
        root_url=local.root_url, model=model, log_path=log_path, prefix_caching=prefix_caching, _server=local,
    )  # fmt: skip
    try:
        if warm_up:
            # The first request compiles and allocates; pay it here, not inside a test's timeout.
            _http_json(
                server.base_url + "/completions",
                {"model": ADAPTER_MODEL, "prompt": [0, 10, 11], "max_tokens": 2, "logprobs": 1},
                timeout=300,
            )
    except BaseException:
        server.stop()
        raise
    return server


@contextlib.contextmanager
def running_server(model: TinyModel, log_path: Path, **kwargs: Any) -> Iterator[VllmServer]:
    """:func:`start_server` as a context manager that always stops the server."""
    server = start_server(model, log_path, **kwargs)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> TinyModel:
    """The tiny model's files, built once per session (see :mod:`tests.support.tiny_model`)."""
    attached = os.environ.get(ATTACH_MODEL_ROOT_ENV)
    if attached:
        return build_model(Path(attached))
    return build_model(tmp_path_factory.mktemp("tiny-model"))


@pytest.fixture(scope="session")
def vllm_server(tiny_model: TinyModel, tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmServer]:
    """ONE real vLLM CPU server for the whole session (see the module docstring)."""
    attached = os.environ.get(ATTACH_ROOT_URL_ENV)
    if attached:
        server = VllmServer(root_url=attached.rstrip("/"), model=tiny_model)
        _wait_ready(server, time.monotonic() + 30)
        yield server
        return
    log_path = tmp_path_factory.mktemp("vllm-log") / "vllm.log"
    with running_server(tiny_model, log_path) as server:
        yield server


def healthy(server: VllmServer) -> bool:
    """Whether the server's process runs and its ``/health`` answers 200 (an engine that died
    behind a live API process answers 500)."""
    if server._server is not None and not server._server.running:
        return False
    try:
        with urllib.request.urlopen(server.root_url + "/health", timeout=10) as r:
            return bool(r.status == 200)
    except OSError:
        return False


def revive(server: VllmServer) -> None:
    """Replace a dead session server by a new one on the same port, in place: fixtures and
    processes that hold its URL go on working. Adapters loaded at run time are gone."""
    old = server._server
    if old is None:
        raise RuntimeError(f"the attached vLLM server at {server.root_url} is not healthy")
    old.stop(timeout_seconds=10)
    fresh = start_server(server.model, server.log_path or old.log_path, port=old.port)
    server.root_url, server._server = fresh.root_url, fresh._server


@pytest.fixture(autouse=True)
def _vllm_server_guard(request: pytest.FixtureRequest) -> Iterator[None]:
    """For tests that use the session's vLLM server: one that crashed the engine fails with the
    server's log, and the next test gets a new server instead of failing in turn."""
    if "vllm_server" not in request.fixturenames:
        yield
        return
    server: VllmServer = request.getfixturevalue("vllm_server")
    if not healthy(server):
        revive(server)
    yield
    if not healthy(server):
        tail = server._server.log_tail() if server._server is not None else ""
        pytest.fail(f"the session's vLLM server died during this test; its log ends:\n{tail}", pytrace=False)


def _serve(argv: list[str]) -> int:
    root = Path(argv[0])
    port = int(argv[1]) if len(argv) > 1 else free_port()
    model = build_model(root)
    # SIGTERM stops the server too (the finally below), not only Ctrl-C.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    server = start_server(model, root / "vllm.log", port=port)
    print(f"export {ATTACH_ROOT_URL_ENV}={server.root_url}")
    print(f"export {ATTACH_MODEL_ROOT_ENV}={root}", flush=True)
    try:
        while server._server is not None and server._server.running:
            time.sleep(1.0)
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "serve":
        raise SystemExit(_serve(sys.argv[2:]))
    print("usage: python -m tests.support.vllm_server serve ROOT [PORT]", file=sys.stderr)
    raise SystemExit(2)
