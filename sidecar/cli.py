"""``sidecar`` command line: run, demo, config show|check, clusters, judge, simulate, eval, eval-alerts."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from sidecar.errors import BrokerError, ConfigError

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_BROKER = 3  # the brokers cannot give the configured guarantee, or none answered


def _add_config_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--config", type=Path, default=None, metavar="FILE", help="YAML configuration file (also SIDECAR_CONFIG_FILE)"
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sidecar", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p_run = sub.add_parser("run", help="consume the configured Kafka topic (production)")
    _add_config_arg(p_run)

    from sidecar.tools.demo.cli import add_demo_parser

    add_demo_parser(sub, _add_config_arg)

    p_cfg = sub.add_parser("config", help="show or check the effective configuration")
    cfg_sub = p_cfg.add_subparsers(dest="config_command", required=True, metavar="ACTION")
    p_show = cfg_sub.add_parser("show", help="print the effective configuration, secrets masked")
    _add_config_arg(p_show)
    p_check = cfg_sub.add_parser("check", help="validate the configuration and exit 0 or 2")
    _add_config_arg(p_check)

    from sidecar.tools.clustering.cli import add_clusters_parser

    add_clusters_parser(sub)
    from sidecar.tools.judge.cli import add_judge_parser
    from sidecar.tools.simulator.cli import add_simulate_parser

    add_judge_parser(sub)
    add_simulate_parser(sub)
    from sidecar.tools.eval.cli import add_eval_parser

    add_eval_parser(sub)
    from sidecar.tools.eval.alert_cli import add_alerts_parser

    add_alerts_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if argv is not None:
        args.argv = list(argv)  # what reports record as their command line (default: sys.argv)
    try:
        return int(args.handler(args)) if hasattr(args, "handler") else _dispatch(args)
    except ConfigError as exc:
        print(f"sidecar: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except BrokerError as exc:
        print(f"sidecar: {exc}", file=sys.stderr)
        return EXIT_BROKER
    except KeyboardInterrupt:
        return 130


def _dispatch(args: argparse.Namespace) -> int:
    from sidecar.config import dump_yaml, load_config

    if args.command == "config":
        cfg = load_config(args.config)
        if args.config_command == "show":
            sys.stdout.write(dump_yaml(cfg))
        else:
            from sidecar.telemetry.web_config import load_web_config

            # The listeners' web-config files too: a bad hash or certificate fails here, not at start.
            for binding in cfg.http.bindings():
                if binding.web_config_file is not None:
                    load_web_config(binding.web_config_file)
            print("configuration is valid")
        return EXIT_OK
    if args.command == "run":
        from sidecar.app import run_forever

        return run_forever(load_config(args.config))
    raise AssertionError(f"unhandled command {args.command}")  # argparse guarantees this is unreachable


if __name__ == "__main__":
    raise SystemExit(main())
