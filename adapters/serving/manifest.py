"""The manifest written next to every artifact: what it was built from and how."""

from __future__ import annotations

import hashlib
import json
import platform
import subprocess
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sidecar.tools.command import recorded_command

__all__ = ["MANIFEST_NAME", "file_sha256", "recorded_command"]

MANIFEST_NAME = "manifest.json"


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _git_commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],  # noqa: S607 - git from PATH on purpose
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
            cwd=Path(__file__).parent,
        )
    except OSError:
        return None
    return out.stdout.strip() or None


def write_manifest(out_dir: Path, kind: str, **fields: Any) -> Path:
    """Write ``manifest.json`` into ``out_dir`` (kind, time, code commit, then ``fields``)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    doc: dict[str, Any] = {
        "kind": kind,
        "created_utc": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "code_commit": _git_commit(),
        "python": platform.python_version(),
    }
    doc.update(fields)
    path = out_dir / MANIFEST_NAME
    path.write_text(json.dumps(doc, indent=2, sort_keys=False, default=str) + "\n")
    return path


def read_manifest(out_dir: Path) -> dict[str, Any]:
    data = json.loads((out_dir / MANIFEST_NAME).read_text())
    if not isinstance(data, dict):
        raise TypeError(f"bad manifest in {out_dir.name}")
    return data


def message_cap(adapter_dir: Path | None) -> int | None:
    """The per-message id cap an adapter was trained with (its manifest), None without one."""
    if adapter_dir is None or not (adapter_dir / "manifest.json").exists():
        return None
    manifest = read_manifest(adapter_dir)
    hyper = manifest.get("training", manifest).get("hyperparameters", {})
    cap = hyper.get("max_message_tokens")
    return int(cap) if cap is not None else None
