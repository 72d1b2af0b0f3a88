"""Arguments of ``adapters promote``, ``rollback``, ``release``, ``routes`` and ``maintain``."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from adapters.errors import DataError
from adapters.onboarding.cli import _agent


def _margin(value: str) -> float:
    x = float(value)
    if not -1 < x < 1:
        raise argparse.ArgumentTypeError("must be within (-1, 1)")
    return x


def _drift(value: str) -> float:
    x = float(value)
    if not 0 < x <= 1:
        raise argparse.ArgumentTypeError("must be within (0, 1]")
    return x


MARGIN_HELP = (
    "F1 the candidate must beat the serving adapter's by (default 0); negative: a candidate up to that much "
    "worse is promoted, as long as it clears the floor and does not serve the agent already"
)


def add_parsers(sub: Any) -> None:
    config_help = "the sidecar's YAML config: its Kafka settings and scoring.routing name the routing topic"
    pr = sub.add_parser("promote", help="validate a candidate against the serving adapter; promote it live or refuse")
    pr.add_argument("--agent", type=_agent, required=True)
    pr.add_argument("--onboarding", type=Path, required=True, help="an `adapters onboard` --out directory")
    pr.add_argument("--candidate", type=Path, default=None, help="exported adapter (default: ONBOARDING/adapter)")
    pr.add_argument(
        "--serving-dir", type=Path, default=None, help="the serving adapter's directory, when no row names it"
    )
    pr.add_argument("--base", type=Path, default=None, help="default: the onboarding's base")
    pr.add_argument("--sidecar-config", type=Path, required=True, help=config_help)
    pr.add_argument("--vllm-url", action="append", default=[], help="load the promoted adapter here (repeatable)")
    pr.add_argument("--served-path", type=Path, default=None, help="the candidate's directory as vLLM sees it")
    pr.add_argument("--margin", type=_margin, default=0.0, help=MARGIN_HELP)
    rb = sub.add_parser("rollback", help="restore the agent's previous route on every replica")
    rb.add_argument("--agent", type=_agent, required=True)
    rb.add_argument("--sidecar-config", type=Path, required=True, help=config_help)
    rb.add_argument("--vllm-url", action="append", default=[], help="load the restored adapter here again first")
    rl = sub.add_parser("release", help="lift a rollback's hold: `maintain` may replace the agent's route again")
    rl.add_argument("--agent", type=_agent, required=True)
    rl.add_argument("--sidecar-config", type=Path, required=True, help=config_help)
    ro = sub.add_parser("routes", help="every agent's live route and last decision")
    ro.add_argument("--sidecar-config", type=Path, required=True, help=config_help)
    ma = sub.add_parser("maintain", help="re-onboard untrusted or drifted agents and promote what validates better")
    ma.add_argument("--sidecar-config", type=Path, required=True, help=config_help)
    ma.add_argument("--metrics-url", action="append", required=True, help="a replica's /metrics (repeatable)")
    ma.add_argument("--work", type=Path, required=True, help="onboarding directories go under WORK/<agent>/")
    ma.add_argument("--source", action="append", default=None, help="default: kafka-training: (the fleet's topic)")
    ma.add_argument("--agent", type=_agent, action="append", default=[], help="only these agents")
    ma.add_argument("--base", type=Path, default=None)
    ma.add_argument("--vllm-url", action="append", default=[])
    ma.add_argument("--max-drift", type=_drift, default=0.3, help="a drift signal above it re-onboards the agent")
    ma.add_argument("--margin", type=_margin, default=0.0, help=MARGIN_HELP)
    ma.add_argument("--onboard-flags", default="", help="more `adapters onboard` flags, one string")
    ma.add_argument("--dry-run", action="store_true", help="only say which agents are due")


def run(args: argparse.Namespace) -> object:
    from sidecar.config import load_config
    from sidecar.errors import ConfigError

    try:
        config = load_config(args.sidecar_config)
    except ConfigError as exc:
        raise DataError(f"--sidecar-config: {exc}") from None
    if args.command == "promote":
        from adapters.promotion.promote import PromoteSpec, promote

        return promote(
            PromoteSpec(
                agent=args.agent,
                onboarding=args.onboarding,
                config=config,
                candidate=args.candidate,
                serving_dir=args.serving_dir,
                base=args.base,
                vllm_urls=tuple(args.vllm_url),
                served_path=args.served_path,
                margin=args.margin,
            )
        )
    if args.command == "rollback":
        from adapters.promotion.promote import rollback

        return rollback(args.agent, config, tuple(args.vllm_url))
    if args.command == "release":
        from adapters.promotion.promote import release

        return release(args.agent, config)
    if args.command == "routes":
        from adapters.promotion.promote import routes

        return routes(config)
    from adapters.promotion.maintain import maintain

    args.source = args.source or ["kafka-training:"]
    return maintain(args)
