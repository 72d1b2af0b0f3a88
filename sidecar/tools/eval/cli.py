"""``sidecar eval DATA.jsonl --out DIR``: the paper's evaluation of a dataset, through the live
sidecar's code paths, against a vLLM server, as a self-contained HTML report.

Writes into DIR: ``results.jsonl`` (one row per conversation, appended as it is scored: rerun the
same command to resume, done ids are skipped), ``run.json`` (the settings the rows were made
with: a rerun with other settings is refused), ``clusters.json``, ``summary.json`` (every number
of the report), ``figures/*.png`` and ``report.html`` (opens offline: CSS inline, figures as data
URIs, trees as inline SVG). Exit 0 on success, 1 when vLLM fails, 2 on bad input or usage.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sidecar.errors import ConfigError
from sidecar.tools.argtypes import positive_int
from sidecar.tools.eval.dataset import EvalConversation, read_dataset

if TYPE_CHECKING:
    from sidecar.judge.config import JudgeConfig
    from sidecar.scoring.config import ScoringConfig
    from sidecar.tools.eval.run import ResultsFile

# The scoring stack, sklearn and matplotlib are imported when the command runs, not when the
# ``sidecar`` parser is built (every other subcommand would pay for them).

EXIT_OK, EXIT_FAILURE = 0, 1
DEFAULT_MAX_INPUT_BYTES = 512 * 1024 * 1024


def add_eval_parser(subparsers: Any) -> None:
    """Register the ``eval`` subcommand on the root parser's subparsers."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "eval",
        help="evaluate a JSONL dataset (completion, response trees, goal clusters) into an HTML report",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("input", type=Path, help="JSONL(.gz), one conversation per line (shared dataset schema)")
    p.add_argument("--out", type=Path, required=True, metavar="DIR", help="output directory (created; resumed)")
    p.add_argument(
        "--config",
        type=Path,
        default=None,
        metavar="FILE",
        help="YAML configuration; its scoring and clustering sections are used",
    )
    p.add_argument("--vllm-url", default=None, help="override scoring.vllm.base_url (ending in /v1)")
    p.add_argument("--model-dir", type=Path, default=None, help="override scoring.tokenizer.model_dir")
    p.add_argument(
        "--adapter",
        default=None,
        help="served LoRA adapter for completion (default: scoring.default_agent.adapter; "
        "'none': the instruct prompt on the base model)",
    )
    p.add_argument(
        "--bundled",
        action="store_true",
        help="start a local vLLM CPU server on the bundled model (adapters/artifacts), as the demo does",
    )
    p.add_argument(
        "--tree-turns",
        choices=["last", "all"],
        default="last",
        help="trees at the last user message (the paper) or at every one",
    )
    p.add_argument(
        "--goals",
        choices=["config", "llm", "extractive", "off"],
        default="config",
        help="goal clustering mode (default: clustering.mode of the config)",
    )
    p.add_argument("--limit", type=positive_int, default=None, help="the first N valid conversations only")
    p.add_argument("--concurrency", type=positive_int, default=4, help="conversations scored at once")
    p.add_argument("--seed", type=int, default=0, help="seed of the truncation protocol's k")
    p.add_argument(
        "--max-input-bytes",
        type=positive_int,
        default=DEFAULT_MAX_INPUT_BYTES,
        help="refuse inputs larger than this, on disk or decompressed",
    )
    p.add_argument(
        "--judge",
        action="store_true",
        help="also run the two-dimensional LLM judge (judge.llm of the config) for a comparison row",
    )
    p.add_argument("--strict", action="store_true", help="a malformed line is an error (default: skipped, counted)")
    p.add_argument("--restart", action="store_true", help="discard DIR's earlier results instead of resuming")
    p.set_defaults(handler=run_eval_command)


def _scoring_config(args: argparse.Namespace, base: ScoringConfig, bundled: dict[str, Any] | None) -> ScoringConfig:
    from sidecar.scoring.config import ScoringConfig
    from sidecar.tools.eval.run import eval_scoring_config

    data = base.model_dump()
    if bundled is not None:
        for key, value in bundled.items():
            data[key] = {**data[key], **value} if isinstance(value, dict) else value
    if args.vllm_url:
        data["vllm"]["base_url"] = args.vllm_url
    if args.model_dir is not None:
        data["tokenizer"]["model_dir"] = str(args.model_dir)
    if args.adapter is not None:
        data["default_agent"]["adapter"] = None if args.adapter.lower() == "none" else args.adapter
    if data["tokenizer"]["model_dir"] is None:
        raise ConfigError(
            "sidecar eval needs the served model's tokenizer: --model-dir DIR, "
            "scoring.tokenizer.model_dir in --config, or --bundled"
        )
    try:
        return eval_scoring_config(ScoringConfig.model_validate(data))
    except ValueError as exc:
        raise ConfigError(f"invalid scoring options: {exc}") from exc


def _make_out(out: Path) -> None:
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out} exists and is not a directory")
    try:
        (out / "figures").mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"cannot create --out {out}: {exc.strerror or exc}") from exc


def _prepare_out(out: Path, fingerprint: dict[str, Any], restart: bool) -> ResultsFile:
    from sidecar.tools.eval.run import ResultsFile

    _make_out(out)
    results = ResultsFile(out / "results.jsonl")
    run_file = out / "run.json"
    if restart:
        results.path.unlink(missing_ok=True)
    elif run_file.exists() and results.path.exists():
        try:
            before = json.loads(run_file.read_text(encoding="utf-8")).get("settings")
        except (OSError, ValueError):
            before = None
        if before != fingerprint:
            changed = sorted(k for k in fingerprint if not isinstance(before, dict) or before.get(k) != fingerprint[k])
            raise ConfigError(
                f"{out} holds results made with other settings ({', '.join(changed) or 'unreadable'}); "
                "use another --out, or --restart to discard them"
            )
    return results


def _write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=1, ensure_ascii=False, allow_nan=False) + "\n", encoding="utf-8")


async def _score(
    cfg: ScoringConfig,
    convs: list[EvalConversation],
    results: ResultsFile,
    args: argparse.Namespace,
    judge_config: JudgeConfig | None,
) -> tuple[int, int]:
    """Score what is not done yet; returns (scored now, already done)."""
    from prometheus_client import CollectorRegistry
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    from sidecar.judge.judge import TwoDimensionalJudge
    from sidecar.judge.metrics import JudgeMetrics
    from sidecar.scoring.scorers import Scorers
    from sidecar.tools.eval.run import ConversationScorer, check_server, score_all

    done = results.load()
    todo = [c for c in convs if c.conversation_id not in done]
    if not todo:
        return 0, len(done)
    await check_server(cfg)
    registry = CollectorRegistry()
    scorers = Scorers.from_config(cfg, registry)
    judge = None if judge_config is None else TwoDimensionalJudge(judge_config, JudgeMetrics(registry))
    await scorers.start()
    columns = (
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
    )
    try:
        with Progress(*columns, console=Console(stderr=True), transient=False) as bar:
            task = bar.add_task("scoring conversations", total=len(todo))
            scorer = ConversationScorer(scorers, tree_turns=args.tree_turns, seed=args.seed, judge=judge)
            await score_all(scorer, todo, results, concurrency=args.concurrency, on_done=lambda _row: bar.advance(task))
    finally:
        await scorers.stop()
        if judge is not None:
            await judge.aclose()
    return len(todo), len(done)


def _clustering(args: argparse.Namespace, config: Any) -> Any:
    cfg = config.clustering
    if args.goals in ("llm", "extractive"):
        cfg = cfg.model_copy(update={"mode": args.goals})
    return cfg


def run_eval_command(args: argparse.Namespace) -> int:
    """Handler of ``sidecar eval``."""
    from sidecar.config import load_config
    from sidecar.telemetry.logging import configure_logging
    from sidecar.tools.eval.run import EvalError

    config = load_config(args.config)
    configure_logging(config.logging, sys.stderr)
    convs, read = read_dataset(args.input, max_bytes=args.max_input_bytes, strict=args.strict)
    if args.limit is not None:
        convs = convs[: args.limit]
    server = None
    bundled: dict[str, Any] | None = None
    if args.bundled:
        from sidecar.tools.demo import models

        reason = models.scoring_unavailable_reason()
        if reason is not None:
            raise ConfigError(f"--bundled: {reason}")
        _make_out(args.out)
        server = models.local_server(args.out / "vllm.log")
        print("starting the bundled model on a local vLLM CPU server (1-2 minutes)...", file=sys.stderr)
        server.start()
        bundled = models.scoring_overrides(server)
    try:
        if server is not None:
            try:
                server.wait_ready_blocking()
            except (RuntimeError, TimeoutError) as exc:
                raise EvalError(f"the local vLLM server did not start (log: {args.out / 'vllm.log'})") from exc
        return _run(args, config, convs, read.describe(), bundled)
    except EvalError as exc:
        print(f"sidecar eval: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    finally:
        if server is not None:
            server.stop()


def _run(
    args: argparse.Namespace, config: Any, convs: list[EvalConversation], read: str, bundled: dict[str, Any] | None
) -> int:
    from sidecar.tools.eval import figures
    from sidecar.tools.eval.goals import cluster_goals
    from sidecar.tools.eval.metrics import completion_examples, judge_rows, tree_samples
    from sidecar.tools.eval.report import build_summary, render_report
    from sidecar.tools.eval.run import settings_fingerprint
    from sidecar.tools.judge.report import comparison_json as comparison

    t0 = time.monotonic()
    cfg = _scoring_config(args, config.scoring, bundled)
    judge_config = config.judge if args.judge else None
    fingerprint = settings_fingerprint(
        cfg, args.tree_turns, args.seed, None if judge_config is None else judge_config.llm.model
    )
    results = _prepare_out(args.out, fingerprint, args.restart)
    _write_json(args.out / "run.json", {"settings": fingerprint})
    scored, resumed = asyncio.run(_score(cfg, convs, results, args, judge_config))
    wanted = {c.conversation_id for c in convs}
    rows = sorted((r for r in results.load().values() if r["id"] in wanted), key=lambda r: r["id"])
    verdicts = {r["id"]: ((r.get("completion") or {}).get("full") or {}).get("complete") for r in rows}
    in_rows = [c for c in convs if c.conversation_id in verdicts]
    clusters: dict[str, Any] = {"k": 0, "mode": "off", "clusters": [], "assignments": {}, "skipped": "--goals off"}
    if args.goals != "off":
        clusters = asyncio.run(cluster_goals(in_rows, _clustering(args, config), verdicts))
    _write_json(args.out / "clusters.json", clusters)
    run = {
        "input": args.input.name,
        "read": read,
        "scored this run": scored,
        "resumed from earlier runs": resumed,
        "vLLM": cfg.vllm.base_url,
        **{k: v for k, v in fingerprint.items() if k != "version"},
        "goal clustering": clusters.get("mode"),
    }
    judged = judge_rows(rows)
    summary = build_summary(rows, clusters, run)
    summary["judge"] = comparison(judged)
    fig_dir = args.out / "figures"
    made: dict[str, Path | None] = {}
    made.update(figures.completion_figures(completion_examples(rows)[0], fig_dir))
    made.update(figures.uncertainty_figures(tree_samples(rows)[0], fig_dir))
    made["clusters"] = figures.cluster_figure(clusters["clusters"], fig_dir)
    summary["run"]["wall seconds"] = round(time.monotonic() - t0, 1)
    _write_json(args.out / "summary.json", summary)
    (args.out / "report.html").write_text(render_report(summary, rows, clusters, made, judged), encoding="utf-8")
    print(
        f"sidecar eval: {len(rows)} conversations in {args.out / 'report.html'} "
        f"({scored} scored now, {resumed} from earlier runs; input: {read})",
        file=sys.stderr,
    )
    return EXIT_OK
