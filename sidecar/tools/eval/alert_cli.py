"""``sidecar eval-alerts DATA.jsonl --out DIR``: how good the alerts are, on labelled conversations.

Replays every conversation turn by turn through the hooks, scoring policy, escalation policy and
post-score stage of ``sidecar run`` (sinks replaced by a recorder; see
:mod:`sidecar.tools.eval.replay`), then reports per outcome and alert kind precision, recall, F1,
alerts per 1,000 turns and lead time with 95 % bootstrap intervals over conversations, beside
baselines with as many alerts, candidate uncertain-turn rules, and the issue's goals.

Writes into DIR: ``alerts.json`` (every number, the run and the command), ``alerts.md``,
``alerts.html`` (self-contained), ``figures/earliness.png`` and ``turns.jsonl`` (per conversation:
labels, trees, P(end) per closed turn, the alerts). Exit 0 done, 1 vLLM fails, 2 bad input or usage.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sidecar.errors import ConfigError
from sidecar.tools.argtypes import positive_int
from sidecar.tools.eval.dataset import EvalConversation, read_dataset

if TYPE_CHECKING:
    from sidecar.alerting.config import AlertingConfig
    from sidecar.scoring.config import ScoringConfig
    from sidecar.tools.eval.replay import Replay

EXIT_OK, EXIT_FAILURE = 0, 1
RULES = ("min_rank", "best_logprob")


def add_alerts_parser(subparsers: Any) -> None:
    p: argparse.ArgumentParser = subparsers.add_parser(
        "eval-alerts",
        help="replay labelled conversations through the live alert path and measure every alert",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("input", type=Path, help="JSONL(.gz), one conversation per line (shared dataset schema)")
    p.add_argument("--out", type=Path, required=True, metavar="DIR", help="output directory (created)")
    p.add_argument("--config", type=Path, default=None, metavar="FILE", help="YAML: its scoring and alerting")
    p.add_argument("--vllm-url", default=None, help="override scoring.vllm.base_url (ending in /v1)")
    p.add_argument("--model-dir", type=Path, default=None, help="override scoring.tokenizer.model_dir")
    p.add_argument("--adapter", default=None, help="served completion adapter ('none': the instruct prompt)")
    p.add_argument("--bundled", action="store_true", help="start a local vLLM CPU server on --model, as the demo does")
    p.add_argument(
        "--model",
        choices=["bundled", "gemma3-270m"],
        default="bundled",
        help="with --bundled: the bundled model and adapter, or the Gemma 3 270M base (no adapter: instruct prompt)",
    )
    p.add_argument("--sample", type=positive_int, default=None, help="N conversations drawn by a hash of id and --seed")
    p.add_argument("--seed", type=int, default=0, help="seed of the sample, the truncation's k and the bootstrap")
    p.add_argument("--rounds", type=int, default=1000, help="bootstrap rounds (0: no intervals)")
    p.add_argument("--concurrency", type=positive_int, default=4, help="hook calls in flight")
    p.add_argument(
        "--end-reason",
        choices=["idle_ttl", "end_event"],
        default="idle_ttl",
        help="how a replayed conversation ends (datasets have no end events: idle_ttl)",
    )
    p.add_argument(
        "--rows",
        type=Path,
        default=None,
        metavar="DIR",
        help="no vLLM: decide again from an earlier run's DIR/turns.jsonl (same input, --sample, --seed) "
        "under this --config's alerting policy",
    )
    p.add_argument("--max-input-bytes", type=positive_int, default=512 * 1024 * 1024)
    p.add_argument("--strict", action="store_true", help="a malformed line is an error")
    p.set_defaults(handler=run_alerts_command)


def sample(convs: list[EvalConversation], n: int | None, seed: int) -> list[EvalConversation]:
    """``n`` conversations in the order of a hash of (seed, id): a random sample, the same each run."""
    if n is None:
        return convs

    def key(c: EvalConversation) -> bytes:
        return hashlib.sha256(f"{seed}\x00{c.conversation_id}".encode()).digest()

    return sorted(convs, key=key)[:n]


def with_rule(alerting: AlertingConfig, rule: str) -> AlertingConfig:
    """``alerting`` with every policy's uncertain-turn rule set to ``rule``."""

    def policy(p: Any) -> Any:
        return p.model_copy(update={"uncertainty": p.uncertainty.model_copy(update={"rule": rule})})

    return alerting.model_copy(
        update={"policy": policy(alerting.policy), "agents": {k: policy(v) for k, v in alerting.agents.items()}}
    )


async def _replay(cfg: ScoringConfig, convs: list[EvalConversation], args: argparse.Namespace) -> list[Replay]:
    from prometheus_client import CollectorRegistry
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from sidecar.scoring.hooks import ScoringHooks
    from sidecar.tools.eval.replay import replay_hooks
    from sidecar.tools.eval.run import check_server, truncation_turn

    await check_server(cfg)
    hooks = ScoringHooks.from_config(cfg, CollectorRegistry())
    await hooks.start()
    try:
        columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
        with Progress(*columns, console=Console(stderr=True)) as bar:
            task = bar.add_task("replaying conversations", total=len(convs))
            return await replay_hooks(
                hooks,
                convs,
                cut_turn=lambda c: truncation_turn(c.conversation_id, c.turns, args.seed),
                end_reason=args.end_reason,
                concurrency=args.concurrency,
                on_done=lambda _r: bar.advance(task),
            )
    finally:
        await hooks.stop()


def run_alerts_command(args: argparse.Namespace) -> int:
    from sidecar.config import load_config
    from sidecar.telemetry.logging import configure_logging
    from sidecar.tools.eval.cli import _make_out, _scoring_config
    from sidecar.tools.eval.run import EvalError

    if args.rounds < 0:
        raise ConfigError("--rounds must be 0 or more")
    config = load_config(args.config)
    configure_logging(config.logging, sys.stderr)
    convs, read = read_dataset(args.input, max_bytes=args.max_input_bytes, strict=args.strict)
    convs = sample(convs, args.sample, args.seed)
    _make_out(args.out)
    if args.rows is not None:
        return _from_rows(args, convs, config, read.describe())
    server = None
    bundled: dict[str, Any] | None = None
    if args.bundled:
        from sidecar.tools.demo import models

        gemma = args.model == "gemma3-270m"
        reason = models.gemma_unavailable_reason() if gemma else models.scoring_unavailable_reason()
        if reason is not None:
            raise ConfigError(f"--bundled: {reason}")
        server = models.local_server(args.out / "vllm.log", model=args.model)
        print("starting the bundled model on a local vLLM CPU server (1-2 minutes)...", file=sys.stderr)
        server.start()
        bundled = models.scoring_overrides(server)
    try:
        if server is not None:
            try:
                server.wait_ready_blocking()
            except (RuntimeError, TimeoutError) as exc:
                raise EvalError(f"the local vLLM server did not start (log: {args.out / 'vllm.log'})") from exc
        cfg = _scoring_config(args, config.scoring, bundled)
        t0 = time.monotonic()
        replays = asyncio.run(_replay(cfg, convs, args))
        return write_report(
            args, replays, alerting=config.alerting, read=read.describe(), cfg=cfg, seconds=time.monotonic() - t0
        )
    except EvalError as exc:
        print(f"sidecar eval-alerts: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    finally:
        if server is not None:
            server.stop()


def _from_rows(args: argparse.Namespace, convs: list[EvalConversation], config: Any, read: str) -> int:
    from sidecar.tools.eval.replay_rows import replays_of

    path = args.rows / "turns.jsonl"
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
        rows = {r["id"]: r for r in map(json.loads, lines)}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"--rows: cannot read {path}: {exc}") from None
    replays = replays_of(convs, rows, args.end_reason)
    return write_report(
        args, replays, alerting=config.alerting, read=f"{read}; decided again from {path}", cfg=None, seconds=0.0
    )


def write_report(
    args: argparse.Namespace,
    replays: list[Replay],
    *,
    alerting: AlertingConfig,
    read: str,
    cfg: ScoringConfig | None,
    seconds: float,
) -> int:
    from sidecar.tools.command import recorded_command
    from sidecar.tools.eval.alert_eval import summarize
    from sidecar.tools.eval.alert_report import earliness_figure, markdown, render_html
    from sidecar.tools.eval.replay import decide
    from sidecar.tools.eval.replay_rows import row_of

    copies = [r.full for r in replays] + [r.cut for r in replays if r.cut is not None]
    rule = alerting.policy.uncertainty.rule
    other = next(r for r in RULES if r != rule)
    alerts = decide(copies, alerting)
    other_alerts = [a for a in decide(copies, with_rule(alerting, other)) if a.kind == "uncertain_turn"]
    summary = summarize(replays, alerts, (other, other_alerts), rounds=args.rounds, seed=args.seed)
    run = {
        "command": recorded_command("sidecar", getattr(args, "argv", None)),
        "input": f"{args.input.name}: {read}",
        "replayed": f"{len(replays)} conversations ({sum(c.turns for c in copies)} user turns with the cut copies)",
        **(
            {
                "base model": cfg.vllm.base_model,
                "adapter": cfg.default_agent.adapter or "none (instruct prompt)",
                "trees": "on" if cfg.tree.enabled else "off",
            }
            if cfg is not None
            else {}
        ),
        "uncertain-turn rule": f"{rule} (target rate {alerting.policy.uncertainty.target_rate})",
        "end reason": args.end_reason,
        "replay seconds": round(seconds, 1),
    }
    fig = earliness_figure(summary, args.out / "figures")
    (args.out / "alerts.json").write_text(
        json.dumps({"run": run, **summary}, indent=1, ensure_ascii=False, allow_nan=False) + "\n", encoding="utf-8"
    )
    (args.out / "alerts.md").write_text(markdown(summary, run), encoding="utf-8")
    (args.out / "alerts.html").write_text(render_html(summary, run, fig), encoding="utf-8")

    with (args.out / "turns.jsonl").open("w", encoding="utf-8") as fh:
        for r in replays:
            fh.write(json.dumps(row_of(r, alerts), ensure_ascii=False) + "\n")
    print(f"sidecar eval-alerts: {len(replays)} conversations in {args.out / 'alerts.html'}", file=sys.stderr)
    return EXIT_OK
