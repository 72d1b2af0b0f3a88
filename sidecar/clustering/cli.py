"""``sidecar clusters``: Algorithm 1 on a JSONL file of conversations (offline)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


def add_clusters_parser(subparsers: Any) -> None:
    """Register the ``clusters`` subcommand on the root parser's subparsers."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "clusters", help="cluster user goals in a JSONL file of conversations (Algorithm 1)"
    )
    p.add_argument("input", type=Path, help="JSONL(.gz) file, one conversation per line")
    p.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    raise SystemExit(f"sidecar clusters: not implemented yet ({args.input})")
