"""The ``adapters onboard`` command line: arguments -> :class:`~adapters.onboarding.onboard.OnboardSpec`."""

from __future__ import annotations

import argparse
import os
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

from adapters.data.sources import check_name
from adapters.errors import DataError
from adapters.evaluation.calibrate import OBJECTIVES
from adapters.onboarding.onboard import ARTIFACTS, OnboardSpec
from adapters.serving.manifest import read_manifest
from adapters.training.recipe import LoraRecipe
from sidecar.tools.argtypes import positive_int

# The committed adapter's recipe (adapters/README.md), for a fresh adapter on a given base.
COMMITTED_RECIPE = LoraRecipe(
    epochs=2.0,
    learning_rate=2e-3,
    max_context_tokens=256,
    loss_on="conversation",
    decision_weight=20.0,
    decision_windows=1,
    forgery_windows=1,
)
# Onboarding trains on few conversations: three decision windows per conversation instead of the
# initial adapter's one, two epochs. Chosen on SGD's validation slice (train-side conversations no
# learning-curve point uses, 200 for onboarding): P(end) ranked better (ROC-AUC 0.974 against
# 0.960) and the calibrated threshold reached F1 0.943 against 0.918, for 1.7 times the steps
# (a development measurement with ``python -m adapters.evaluation.curve``; its report is not committed).
# Flags override these.
ONBOARD_DEFAULTS: dict[str, Any] = {"decision_windows": 3, "epochs": 2.0}
_RECIPE_FLAGS = {
    "epochs": "epochs",
    "lr": "learning_rate",
    "max_context_tokens": "max_context_tokens",
    "max_message_tokens": "max_message_tokens",
    "decision_windows": "decision_windows",
    "forgery_windows": "forgery_windows",
    "batch_size": "batch_size",
    "micro_batch_size": "micro_batch_size",
    "rank": "rank",
    "loss_on": "loss_on",
    "decision_weight": "decision_weight",
}


def _agent(value: str) -> str:
    try:
        return check_name(value)
    except DataError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _fraction(value: str) -> float:
    x = float(value)
    if not 0 < x < 1:
        raise argparse.ArgumentTypeError("must be between 0 and 1")
    return x


def _unit(value: str) -> float:
    x = float(value)
    if not 0 <= x <= 1:
        raise argparse.ArgumentTypeError("must be within 0..1")
    return x


def _ratio(value: str) -> float:
    x = float(value)
    if x < 0:
        raise argparse.ArgumentTypeError("must be >= 0")
    return x


def add_parser(sub: Any) -> None:
    on = sub.add_parser("onboard", help="an agent's conversations -> a validated, served, routed adapter")
    on.add_argument("--agent", type=_agent, required=True, help="the agent's name (as in the events)")
    on.add_argument(
        "--source",
        action="append",
        required=True,
        metavar="SPEC",
        help="JSONL file or directory, training store (DIR or DIR/<agent>), the fleet's training topic "
        "(kafka-training://HOST:PORT/TOPIC, or kafka-training: with --sidecar-config), an event topic "
        "(kafka://HOST:PORT/TOPIC, or kafka: with --sidecar-config); repeat to combine",
    )
    on.add_argument("--out", type=Path, required=True, help="working directory: steps, adapter, report")
    on.add_argument("--base", type=Path, default=None, help="base model dir (default: the bundled base)")
    on.add_argument(
        "--init-adapter",
        default=None,
        help="adapter to continue, or 'none' for a fresh one (default: the bundled adapter when "
        "--base is not given, else none)",
    )
    for flag, typ in (
        ("epochs", float),
        ("lr", float),
        ("max-context-tokens", positive_int),
        ("max-message-tokens", positive_int),
        ("decision-windows", int),
        ("forgery-windows", int),
        ("batch-size", positive_int),
        ("rank", positive_int),
    ):
        default = ONBOARD_DEFAULTS.get(_RECIPE_FLAGS[flag.replace("-", "_")], "the initial adapter's own recipe")
        on.add_argument(f"--{flag}", type=typ, default=None, help=f"default: {default}")
    on.add_argument(
        "--micro-batch-size",
        type=positive_int,
        default=None,
        help="sequences per forward/backward pass, at most the batch size; gradients are accumulated "
        "to the same update (1-2 fits an 8B base on a 24 GiB GPU); default: the whole batch",
    )
    on.add_argument(
        "--loss-on",
        choices=("target", "conversation", "decisions"),
        default=None,
        help="default: the initial adapter's own recipe (see train-lora)",
    )
    on.add_argument("--decision-weight", type=float, default=None, help="default: the initial adapter's own recipe")
    on.add_argument("--min-steps", type=int, default=40, help="at least this many optimiser steps")
    on.add_argument(
        "--mix",
        action="append",
        default=[],
        metavar="SPEC",
        help="general conversations mixed into training against forgetting ('demo-sample': the "
        "demo's bundled conversations)",
    )
    on.add_argument("--mix-ratio", type=_ratio, default=1.0, help="general conversations per agent conversation")
    on.add_argument("--max-conversations", type=positive_int, default=5000, help="keep the most recent N")
    on.add_argument("--min-conversations", type=positive_int, default=20)
    on.add_argument("--holdback-fraction", type=_fraction, default=0.2)
    on.add_argument("--min-holdback", type=positive_int, default=10)
    on.add_argument(
        "--objective",
        choices=OBJECTIVES,
        default="balanced_accuracy",
        help="what the P(end) threshold maximises on the held-back slice",
    )
    on.add_argument("--rule", choices=("auto", "greedy", "threshold"), default="auto")
    on.add_argument(
        "--min-validation-f1",
        type=_unit,
        default=0.8,
        help="below it the adapter is recorded (and reported by the sidecar) as untrusted",
    )
    on.add_argument("--served-name", type=_agent, default=None, help="default: <agent>-<8 hex of the weights>")
    on.add_argument("--base-model-name", default="base", help="vLLM's --served-model-name of the base")
    on.add_argument("--vllm-url", default=None, help="load the adapter into this running vLLM")
    on.add_argument("--served-path", type=Path, default=None, help="the adapter dir as the vLLM server sees it")
    on.add_argument("--config", type=Path, default=None, help="sidecar YAML to patch with the routing")
    on.add_argument(
        "--sidecar-config", type=Path, default=None, help="Kafka settings for a kafka: or kafka-training: source"
    )
    on.add_argument("--max-input-bytes", type=positive_int, default=4 * 1024**3)
    on.add_argument("--seed", type=int, default=0)
    on.add_argument(
        "--threads",
        type=positive_int,
        default=None,
        help="CPU threads for training and validation (default: the CPUs not already busy - those this "
        "process may use, at most torch's one per physical core, less the 1-minute load average - at least 1)",
    )


def default_threads(torch_threads: int, *, usable: int | None = None, load: float | None = None) -> tuple[int, str]:
    """Training threads that do not oversubscribe the machine, and the reason in words.

    torch's default is one thread per physical core whatever else runs: on a 2-core machine at a
    load average of 10, a training step of the bundled base took 7.9 s with two threads and 1.5 s
    with one (adapters/README.md), each thread waiting on the others at every operation. So the
    threads are the idle CPUs, at least one."""
    if usable is None:
        usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    if load is None:
        load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    cpus = max(1, min(usable, torch_threads))
    threads = max(1, cpus - round(load))
    return threads, f"{cpus} CPUs, 1-minute load {load:.1f}"


def inherited_recipe(init_adapter: Path | None, overrides: dict[str, Any] | None = None) -> LoraRecipe:
    """The recipe ``init_adapter`` was trained with (its manifest), else the committed one; then ``overrides``."""
    recipe = COMMITTED_RECIPE
    if init_adapter is not None and (init_adapter / "manifest.json").exists():
        manifest = read_manifest(init_adapter)
        hyper = manifest.get("training", manifest).get("hyperparameters", {})
        # The micro-batch size fitted the memory of the machine that trained it, not this one.
        known = {f.name for f in fields(LoraRecipe)} - {"micro_batch_size"}
        values: dict[str, Any] = {k: (tuple(v) if k == "target_modules" else v) for k, v in hyper.items() if k in known}
        recipe = replace(recipe, **values)
    return replace(recipe, **(overrides or {}))


def _given(args: argparse.Namespace) -> dict[str, Any]:
    return {attr: getattr(args, flag) for flag, attr in _RECIPE_FLAGS.items() if getattr(args, flag) is not None}


def bundled_artifacts(cwd: Path | None = None) -> Path:
    """The committed artifacts of the checkout the command runs from (the working directory, when it
    is one), else those next to the installed package: an install made from another checkout must
    not train on, and print commands naming, that checkout's files."""
    here = (cwd or Path.cwd()) / "adapters" / "artifacts"
    if (here / "base" / "config.json").is_file() and (here / "completion" / "adapter_config.json").is_file():
        return here.resolve()
    return ARTIFACTS


def spec_from_args(args: argparse.Namespace) -> OnboardSpec:
    artifacts = bundled_artifacts()
    base: Path = args.base or artifacts / "base"
    init: Path | None
    if args.init_adapter is None:
        init = artifacts / "completion" if args.base is None else None
    else:
        init = None if args.init_adapter == "none" else Path(args.init_adapter)
    for path, what in ((base, "base model"), (init, "initial adapter")):
        if path is not None and not path.is_dir():
            raise DataError(f"no {what} at {path}")
    try:
        recipe = inherited_recipe(init, {**ONBOARD_DEFAULTS, **_given(args)})
    except ValueError as exc:  # e.g. a micro-batch larger than the (inherited) batch
        raise DataError(str(exc)) from None
    return OnboardSpec(
        agent=args.agent,
        sources=tuple(args.source),
        out=args.out,
        base=base,
        init_adapter=init,
        recipe=recipe,
        min_steps=args.min_steps,
        mix=tuple(args.mix),
        mix_ratio=args.mix_ratio,
        max_conversations=args.max_conversations,
        min_conversations=args.min_conversations,
        holdback_fraction=args.holdback_fraction,
        min_holdback=args.min_holdback,
        objective=args.objective,
        rule=args.rule,
        min_validation_f1=args.min_validation_f1,
        served_name=args.served_name,
        base_model_name=args.base_model_name,
        vllm_url=args.vllm_url,
        served_path=args.served_path,
        config=args.config,
        sidecar_config=args.sidecar_config,
        max_input_bytes=args.max_input_bytes,
        seed=args.seed,
    )
