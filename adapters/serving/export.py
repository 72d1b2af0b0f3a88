"""``adapters export``: a clean adapter directory vLLM loads with ``--lora-modules name=DIR``."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from adapters.serving.manifest import MANIFEST_NAME, file_sha256, read_manifest, write_manifest

ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")


class ExportError(ValueError):
    """The trained adapter directory cannot be served as is."""


def export_adapter(trained_dir: Path, out_dir: Path, base_name: str, max_lora_rank: int = 8) -> dict[str, Any]:
    """Copy the peft files, point ``base_model_name_or_path`` at ``base_name``, check the rank."""
    for f in ADAPTER_FILES:
        if not (trained_dir / f).is_file():
            raise ExportError(f"missing {f} in the trained adapter directory")
    config = json.loads((trained_dir / "adapter_config.json").read_text())
    if config.get("peft_type") != "LORA":
        raise ExportError(f"not a LoRA adapter: {config.get('peft_type')!r}")
    rank = int(config.get("r", 0))
    if not 0 < rank <= max_lora_rank:
        raise ExportError(f"rank {rank} is not in 1..{max_lora_rank} (vLLM --max-lora-rank)")
    if config.get("modules_to_save"):
        raise ExportError("modules_to_save is not served by vLLM LoRA")
    out_dir.mkdir(parents=True, exist_ok=True)
    # A relative base name, never a path of the training machine.
    config["base_model_name_or_path"] = base_name
    (out_dir / "adapter_config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    shutil.copyfile(trained_dir / "adapter_model.safetensors", out_dir / "adapter_model.safetensors")
    trained = read_manifest(trained_dir) if (trained_dir / MANIFEST_NAME).exists() else {}
    trained.pop("kind", None)
    trained.pop("created_utc", None)
    write_manifest(
        out_dir,
        "exported-lora-adapter",
        served_base=base_name,
        rank=rank,
        adapter_sha256=file_sha256(out_dir / "adapter_model.safetensors"),
        training=trained,
    )
    return {"rank": rank, "bytes": (out_dir / "adapter_model.safetensors").stat().st_size}
