"""What ``sidecar demo`` scores with: the small completion model bundled with the repository
(``adapters/artifacts/``, trained by ``adapters``), served by a local vLLM CPU server."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

from sidecar.tools.local_vllm import LocalVllmServer, LocalVllmSpec, vllm_python

# The demo runs from a clone: the trained artifacts sit next to the package, not inside it.
ARTIFACTS = Path(__file__).resolve().parents[3] / "adapters" / "artifacts"
ADAPTER_NAME = "completion"
TRAINED_CONTEXT_TOKENS = 256


def bundled_model(artifacts: Path = ARTIFACTS) -> tuple[Path, Path] | None:
    """(base model dir, completion adapter dir) when both are present."""
    base, adapter = artifacts / "base", artifacts / ADAPTER_NAME
    if (base / "config.json").exists() and (adapter / "adapter_config.json").exists():
        return base, adapter
    return None


def scoring_unavailable_reason(artifacts: Path = ARTIFACTS) -> str | None:
    """Why scoring cannot run here, or None when it can."""
    if bundled_model(artifacts) is None:
        return f"no bundled model under {artifacts} (train one with `adapters`)"
    if not vllm_python().exists():
        return f"no vLLM interpreter at {vllm_python()} (run `bash .ci/setup`)"
    return None


def embeddings_available() -> bool:
    return importlib.util.find_spec("sentence_transformers") is not None


def local_server(log_path: Path, artifacts: Path = ARTIFACTS) -> LocalVllmServer:
    found = bundled_model(artifacts)
    if found is None:
        raise FileNotFoundError(f"no bundled model under {artifacts}")
    base, adapter = found
    return LocalVllmServer(LocalVllmSpec(model_dir=base, lora_modules={ADAPTER_NAME: adapter}), log_path)


def scoring_overrides(server: LocalVllmServer) -> dict[str, Any]:
    """Config overrides that point the scorers at the local server and the bundled adapter."""
    adapter = server.spec.lora_modules.get(ADAPTER_NAME)
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
        "default_agent": {"adapter": ADAPTER_NAME},
        # The bundled adapter is trained on the last 256 token ids of a conversation, each message
        # capped as its manifest records: serve exactly that window.
        "max_prompt_tokens": TRAINED_CONTEXT_TOKENS,
        "max_message_tokens": trained_message_cap(adapter_dir),
        "prompt_truncation": "tail",
        "tree": {"alpha": DEMO_TREE_ALPHA, "max_depth_tokens": 24, "max_requests": 16},
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


def clustering_overrides() -> dict[str, Any]:
    """LLM-free goal clusters (the bundled model is no instruct model), re-run every 30 s."""
    return {"enabled": True, "mode": "extractive", "k1": 12, "min_conversations": 40, "recluster_interval_seconds": 30}
