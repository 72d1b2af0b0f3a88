"""``sidecar judge``: the two-dimensional judge on JSONL files of conversations, offline.

Writes one JSON line per judged example (``--output``: the verdict, both dimensions with their
explanations and items, calls and tokens) and prints a summary: verdict counts, malformed answers
and errors per dimension, calls and tokens in all and per conversation, and, when labels are known
(``--label-field`` or ``--protocol truncation``), accuracy / precision / recall / F1 with the
comparison table (``--markdown``; ``--compare`` adds the judge-free rows of an ``adapters eval``
report beside the judge's row).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from sidecar.errors import ConfigError
from sidecar.judge.config import JudgeConfig
from sidecar.judge.judge import TwoDimensionalJudge
from sidecar.judge.metrics import JudgeMetrics
from sidecar.judge.verdict import JudgeVerdict
from sidecar.telemetry.logging import configure_logging
from sidecar.tools.argtypes import positive_int
from sidecar.tools.judge.dataset import JudgeExample, ReadStats, check_input, read_examples
from sidecar.tools.judge.report import (
    MethodRow,
    classification_row,
    comparison_json,
    comparison_markdown,
    rows_from_eval_section,
)

EXIT_OK, EXIT_FAILURE, EXIT_USAGE = 0, 1, 2
DEFAULT_MAX_FILE_BYTES = 512 * 1024 * 1024
MAX_DESCRIPTION_FILE_BYTES = 64 * 1024
MAX_REPORT_FILE_BYTES = 16 * 1024 * 1024


def add_judge_parser(subparsers: Any) -> None:
    """Register the ``judge`` subcommand on the root parser's subparsers."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "judge",
        help="judge conversations with the two-dimensional LLM judge (accuracy, completeness)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("inputs", type=Path, nargs="+", metavar="FILE", help="JSONL(.gz) file, one conversation per line")
    p.add_argument("--config", type=Path, default=None, metavar="FILE", help="YAML configuration; its judge section")
    p.add_argument("--base-url", default=None, help="override judge.llm.base_url (OpenAI-compatible root, /v1)")
    p.add_argument("--model", default=None, help="override judge.llm.model")
    p.add_argument("--api-key-env", default=None, metavar="VAR", help="read the endpoint's API key from this env var")
    p.add_argument("--max-tokens", type=positive_int, default=None, help="override judge.llm.max_tokens")
    p.add_argument(
        "--structured-output",
        choices=["json_schema", "vllm_structured_outputs", "none"],
        default=None,
        help="override judge.llm.structured_output",
    )
    p.add_argument("--concurrency", type=positive_int, default=None, help="override judge.llm.max_concurrency")
    p.add_argument("--max-attempts", type=positive_int, default=None, help="override judge.llm.max_attempts")
    p.add_argument(
        "--max-transcript-chars",
        type=positive_int,
        default=None,
        help="override judge.max_transcript_chars (the middle of longer conversations is left out)",
    )
    p.add_argument("--max-message-chars", type=positive_int, default=None, help="override judge.max_message_chars")
    p.add_argument("--agent-description-file", type=Path, default=None, help="what the agent can do (judge prompts)")
    p.add_argument("--limit", type=positive_int, default=None, help="judge at most N examples in all")
    p.add_argument(
        "--protocol",
        choices=["none", "truncation"],
        default="none",
        help="truncation: each conversation (complete) and a copy cut at a seeded turn (incomplete)",
    )
    p.add_argument(
        "--label-field",
        default=None,
        metavar="DOTTED",
        help="known completion label of each record, e.g. meta.success (protocol none)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the truncation protocol")
    p.add_argument(
        "--max-file-bytes",
        type=positive_int,
        default=DEFAULT_MAX_FILE_BYTES,
        help="refuse input files larger than this",
    )
    p.add_argument("--no-text", action="store_true", help="leave explanations and items out of --output")
    p.add_argument("--output", type=Path, default=None, help="write one JSON line per judged example here")
    p.add_argument("--summary", type=Path, default=None, help="write the summary JSON here instead of stdout")
    p.add_argument("--markdown", type=Path, default=None, help="write the comparison table (Markdown) here")
    p.add_argument(
        "--compare",
        type=Path,
        default=None,
        metavar="REPORT",
        help="an adapters eval report.json whose judge-free rows go beside the judge's",
    )
    p.add_argument(
        "--compare-section",
        default=None,
        metavar="DATASET[.PROTOCOL]",
        help="which section of --compare, e.g. sgd or star.protocol",
    )
    p.set_defaults(handler=run_judge_command)


def _read_small(path: Path, limit: int, what: str) -> str:
    check_input(path, limit)
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read {what} {path}: {exc}") from exc


# judge.llm field <- command-line option
_LLM_OVERRIDES = (
    ("base_url", "base_url"),
    ("model", "model"),
    ("max_tokens", "max_tokens"),
    ("structured_output", "structured_output"),
    ("max_concurrency", "concurrency"),
    ("max_attempts", "max_attempts"),
)


def judge_config(args: argparse.Namespace) -> JudgeConfig:
    """The judge section of ``--config`` with the command line's overrides, validated."""
    from sidecar.config import load_config

    root = load_config(args.config)
    configure_logging(root.logging)  # to stderr: stdout carries the summary
    base: dict[str, Any] = getattr(root, "judge", JudgeConfig()).model_dump()
    llm = dict(base["llm"])
    for key, attr in _LLM_OVERRIDES:
        if getattr(args, attr) is not None:
            llm[key] = getattr(args, attr)
    if args.api_key_env is not None:
        if args.api_key_env not in os.environ:
            raise ConfigError(f"--api-key-env: the environment variable {args.api_key_env} is not set")
        llm["api_key"] = os.environ[args.api_key_env]
    else:
        llm["api_key"] = llm["api_key"].get_secret_value()
    for key in ("max_transcript_chars", "max_message_chars"):
        if getattr(args, key) is not None:
            base[key] = getattr(args, key)
    if args.agent_description_file is not None:
        base["agent_description"] = _read_small(args.agent_description_file, MAX_DESCRIPTION_FILE_BYTES, "file")
    try:
        return JudgeConfig.model_validate({**base, "llm": llm})
    except ValueError as exc:
        raise ConfigError(f"invalid judge options: {exc}") from exc


def _compare_rows(args: argparse.Namespace) -> list[MethodRow]:
    if args.compare is None:
        return []
    if not args.compare_section:
        raise ConfigError("--compare needs --compare-section (a dataset name of the report, e.g. sgd)")
    try:
        doc = json.loads(_read_small(args.compare, MAX_REPORT_FILE_BYTES, "report"))
    except ValueError as exc:
        raise ConfigError(f"--compare {args.compare}: not JSON") from exc
    dataset, _, protocol = str(args.compare_section).partition(".")
    results = doc.get("results", doc) if isinstance(doc, dict) else {}
    section = results.get(dataset, {}) if isinstance(results, dict) else {}
    section = section.get(protocol or "protocol", {}) if isinstance(section, dict) else {}
    rows = rows_from_eval_section(section) if isinstance(section, dict) else []
    if not rows:
        raise ConfigError(f"--compare {args.compare}: no rows in section {args.compare_section!r}")
    return rows


def _example_row(ex: JudgeExample, v: JudgeVerdict, include_text: bool) -> dict[str, Any]:
    return {
        "conversation_id": ex.conversation_id,
        "source": ex.source,
        "kind": ex.kind,
        "label": ex.label,
        "messages": len(ex.messages),
        **v.outcome(include_text=include_text),
    }


def _summary(verdicts: Sequence[JudgeVerdict]) -> dict[str, Any]:
    n = len(verdicts)
    calls = sum(v.calls for v in verdicts)
    prompt = sum(v.prompt_tokens for v in verdicts)
    gen = sum(v.completion_tokens for v in verdicts)
    dims = ("accuracy", "completeness")
    malformed = {d: sum(1 for v in verdicts if getattr(v, d).malformed) for d in dims}
    return {
        "judged": n,
        "verdicts": {k: sum(1 for v in verdicts if v.label == k) for k in ("complete", "incomplete", "undecided")},
        "malformed": malformed,
        "malformed_rate": sum(malformed.values()) / calls if calls else None,
        "errors": {d: sum(1 for v in verdicts if getattr(v, d).error is not None) for d in dims},
        "calls": calls,
        "prompt_tokens": prompt,
        "completion_tokens": gen,
        "per_conversation": {
            "calls": calls / n if n else None,
            "prompt_tokens": prompt / n if n else None,
            "completion_tokens": gen / n if n else None,
        },
    }


def judge_row(method: str, labelled: Sequence[tuple[bool, JudgeVerdict]]) -> MethodRow:
    """The judge's row of the comparison table (undecided examples count as predicted incomplete)."""
    return classification_row(
        method,
        [y for y, _ in labelled],
        [v.complete for _, v in labelled],
        judge_free=False,
        undecided=sum(1 for _, v in labelled if not v.decided),
        calls=sum(v.calls for _, v in labelled),
        prompt_tokens=sum(v.prompt_tokens for _, v in labelled),
        completion_tokens=sum(v.completion_tokens for _, v in labelled),
    )


async def _judge_all(judge: TwoDimensionalJudge, examples: Sequence[JudgeExample]) -> list[JudgeVerdict]:
    # The client bounds requests in flight; this bounds the conversations held open at once.
    sem = asyncio.Semaphore(max(1, judge.config.llm.max_concurrency))

    async def one(ex: JudgeExample) -> JudgeVerdict:
        async with sem:
            return await judge.judge(ex.messages)

    async with asyncio.TaskGroup() as tg:
        tasks = [tg.create_task(one(ex)) for ex in examples]
    return [t.result() for t in tasks]


def _load(args: argparse.Namespace) -> tuple[list[JudgeExample], ReadStats]:
    if args.label_field and args.protocol != "none":
        raise ConfigError("--label-field and --protocol truncation are exclusive (the protocol makes the labels)")
    for path in args.inputs:
        check_input(path, args.max_file_bytes)
    stats = ReadStats()
    examples: list[JudgeExample] = []
    for path in args.inputs:
        found = read_examples(
            path,
            stats=stats,
            protocol=args.protocol,
            label_field=args.label_field,
            seed=args.seed,
            max_file_bytes=args.max_file_bytes,
        )
        for ex in found:
            if args.limit is not None and len(examples) >= args.limit:
                break
            examples.append(ex)
    if not examples:
        raise ConfigError(f"no valid conversation in {', '.join(map(str, args.inputs))} (skipped: {stats.skipped})")
    return examples, stats


def _write_outputs(
    args: argparse.Namespace,
    cfg: JudgeConfig,
    judged: Sequence[tuple[JudgeExample, JudgeVerdict]],
    summary: dict[str, Any],
    compare: Sequence[MethodRow],
) -> None:
    if args.output is not None:
        with args.output.open("w", encoding="utf-8") as fh:
            for ex, v in judged:
                fh.write(json.dumps(_example_row(ex, v, not args.no_text), ensure_ascii=False) + "\n")
    labelled = [(ex.label, v) for ex, v in judged if ex.label is not None]
    if labelled:
        rows = [*compare, judge_row(f"two-dimensional judge ({cfg.llm.model})", labelled)]
        summary["classification"] = comparison_json(rows[-1:])[0]
        if compare:
            summary["comparison"] = comparison_json(rows)
        if args.markdown is not None:
            args.markdown.write_text(comparison_markdown(rows, title=", ".join(p.name for p in args.inputs)))
    text = json.dumps(summary, indent=1, ensure_ascii=False)
    if args.summary is not None:
        args.summary.write_text(text + "\n", encoding="utf-8")
    else:
        sys.stdout.write(text + "\n")


def run_judge_command(args: argparse.Namespace) -> int:
    """Handler of ``sidecar judge``: 0 on success, 1 when the endpoint failed every call, 2 on bad usage."""
    cfg = judge_config(args)
    for flag in ("output", "summary", "markdown"):
        path = getattr(args, flag)
        if path is not None and not path.parent.is_dir():
            raise ConfigError(f"--{flag}: directory {path.parent} does not exist")
    examples, stats = _load(args)
    compare = _compare_rows(args)
    judge = TwoDimensionalJudge(cfg, JudgeMetrics(CollectorRegistry()))

    async def main() -> list[JudgeVerdict]:
        try:
            return await _judge_all(judge, examples)
        finally:
            await judge.aclose()

    t0 = time.monotonic()
    verdicts = asyncio.run(main())
    summary: dict[str, Any] = {
        "inputs": [str(p) for p in args.inputs],
        "read": stats.records,
        "skipped": stats.skipped,
        "model": cfg.llm.model,
        **_summary(verdicts),
        "wall_seconds": round(time.monotonic() - t0, 3),
    }
    try:
        _write_outputs(args, cfg, list(zip(examples, verdicts, strict=True)), summary, compare)
    except OSError as exc:
        print(f"sidecar judge: cannot write the results: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    print(
        f"judged {len(verdicts)} examples: {summary['verdicts']}, {summary['calls']} calls, "
        f"{summary['prompt_tokens']} + {summary['completion_tokens']} tokens",
        file=sys.stderr,
    )
    failed = sum(1 for v in verdicts if v.accuracy.error is not None and v.completeness.error is not None)
    return EXIT_FAILURE if failed == len(verdicts) else EXIT_OK
