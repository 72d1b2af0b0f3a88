"""Leave one data set out, base against base (``python -m adapters.evaluation.lodo``).

For every base B (``--base NAME=DIR``: a directory with the end tag, as ``adapters add-end-tag``
writes it) and every data set D of ``--datasets``: a LoRA adapter is trained on B with the bundled
adapter's recipe (its manifest; ``--epochs`` and ``--lr`` override) on the first ``--per-dataset``
train-side conversations of every *other* data set, then scored on D's test side under the paper's
truncation protocol (``prepare``'s examples: each conversation whole, and cut before a random agent
turn; the first ``--test`` of each label). Every base sees the same conversations, recipe and
examples, so the difference is the base.

Scoring is in-process (transformers + peft, float32, the sidecar's prompt ids), as ``adapters
validate``; ``adapters eval`` runs the same ids through vLLM. A point is written as soon as it is
done and a rerun skips it, so a long run can be stopped and resumed. Then ``lodo.json``, ``lodo.md``
and ``lodo.png``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import structlog

from adapters.data.conversations import messages_from_json
from adapters.errors import DataError
from adapters.evaluation.points import open_points, save_points
from sidecar.tools.classification import grouped_bootstrap

log = structlog.get_logger()

ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"
BOOTSTRAP_ROUNDS = 1000


def _lines(path: Path) -> list[dict[str, Any]]:
    with path.open(encoding="utf-8") as fh:
        return [json.loads(x) for x in fh if x.strip()]


def test_examples(data: Path, dataset: str, per_label: int) -> list[tuple[str, list[Any], bool]]:
    """The first ``per_label`` complete and the first ``per_label`` cut examples of D's test side."""
    taken = {True: 0, False: 0}
    out: list[tuple[str, list[Any], bool]] = []
    for e in _lines(data / dataset / "test.jsonl"):
        label = bool(e["complete"])
        if taken[label] < per_label:
            taken[label] += 1
            out.append((str(e["conversation_id"]), list(messages_from_json(e["messages"])), label))
    if not taken[True] or not taken[False]:
        raise DataError(f"{dataset}: the test side needs complete and cut examples, has {taken}")
    return out


def interval(
    groups: list[str], labels: list[bool], predicted: list[bool], p_end: list[float], seed: int = 0
) -> dict[str, list[float] | None]:
    """95 % percentile bootstrap of F1(complete) and ROC-AUC, resampling conversations (a whole and a
    cut copy of one conversation are not independent); both figures see the same draws."""
    from sklearn.metrics import f1_score, roc_auc_score

    y, yhat, p = np.array(labels), np.array(predicted), np.array(p_end)

    def f_complete(pick: npt.NDArray[np.intp]) -> float:
        return float(f1_score(y[pick], yhat[pick], zero_division=0.0))

    def auc(pick: npt.NDArray[np.intp]) -> float | None:
        return None if y[pick].all() or not y[pick].any() else float(roc_auc_score(y[pick], p[pick]))

    def q(xs: list[float]) -> list[float] | None:
        return [round(float(np.percentile(xs, 2.5)), 3), round(float(np.percentile(xs, 97.5)), 3)] if xs else None

    return {
        "f1_complete": q(grouped_bootstrap(groups, f_complete, BOOTSTRAP_ROUNDS, seed)),
        "roc_auc": q(grouped_bootstrap(groups, auc, BOOTSTRAP_ROUNDS, seed)),
    }


def calibration_examples(data: Path, dataset: str, count: int) -> list[tuple[str, list[Any], bool]]:
    """D's first ``count`` train-side conversations under the truncation protocol: messages only, no
    label (each whole copy is "complete", each cut copy "incomplete"), what onboarding calibrates on."""
    from adapters.data.conversations import Conversation, eval_examples

    out: list[tuple[str, list[Any], bool]] = []
    for rec in _lines(data / dataset / "train.jsonl")[:count]:
        cid = str(rec["conversation_id"])
        conv = Conversation(cid, dataset, cid, tuple(messages_from_json(rec["messages"])))
        out.extend((cid, list(ex.messages), ex.complete) for ex in eval_examples(conv, 0))
    return out


def _recipe(args: argparse.Namespace) -> Any:
    from adapters.onboarding.cli import inherited_recipe

    overrides = {"epochs": args.epochs, "learning_rate": args.lr}
    return inherited_recipe(args.recipe_from, {k: v for k, v in overrides.items() if v is not None})


def _train(args: argparse.Namespace, base: Path, dataset: str, out: Path) -> dict[str, Any]:
    from adapters.training.lora import train_lora

    recipe = _recipe(args)
    others = [d for d in args.datasets if d != dataset]
    t0 = time.monotonic()
    trained = train_lora(args.data, others, base, out, recipe, max_per_dataset=args.per_dataset)
    seconds = time.monotonic() - t0
    return {
        "trained_on": trained["per_dataset"],
        "sequences": trained["sequences"],
        "steps": trained["steps"],
        "loss_first_10": trained["loss_first_10"],
        "loss_last_10": trained["loss_last_10"],
        "train_seconds": round(seconds, 1),
        "train_seconds_per_conversation": round(seconds / max(sum(trained["per_dataset"].values()), 1), 2),
        "recipe": {
            "epochs": recipe.epochs,
            "learning_rate": recipe.learning_rate,
            "max_context_tokens": recipe.max_context_tokens,
            "max_message_tokens": recipe.max_message_tokens,
            "loss_on": recipe.loss_on,
        },
    }


def _score(args: argparse.Namespace, base: Path, adapter: Path, examples: list[Any], desc: str) -> list[Any]:
    from adapters.onboarding.onboard import score_examples

    recipe = _recipe(args)
    return score_examples(
        base,
        adapter,
        examples,
        max_context_tokens=recipe.max_context_tokens,
        max_message_tokens=recipe.max_message_tokens,
        desc=desc,
    )


def _rule_metrics(scores: dict[str, list[Any]], predicted: list[bool]) -> dict[str, Any]:
    from adapters.evaluation.binary import flat_metrics

    labels, p_end = scores["complete"], scores["p_end"]
    interval_ = interval(scores["conversation_id"], labels, predicted, p_end)
    return {**flat_metrics(labels, predicted, p_end), "interval": interval_}


def point(args: argparse.Namespace, base_name: str, base: Path, dataset: str, done: dict[str, Any]) -> dict[str, Any]:
    """Train, score the test side, calibrate: each stage is skipped when ``done`` already holds it."""
    from adapters.evaluation.calibrate import ScoredExample, calibrate

    p = dict(done)
    out = args.work / base_name / dataset
    if "steps" not in p:
        p.update(_train(args, base, dataset, out))
    if "scores" not in p:
        t0 = time.monotonic()
        scored = _score(args, base, out, test_examples(args.data, dataset, args.test), f"{base_name} {dataset}")
        p["score_seconds"] = round(time.monotonic() - t0, 1)
        p["examples"] = len(scored)
        p["scores"] = {
            "conversation_id": [s.conversation_id for s in scored],
            "complete": [s.complete for s in scored],
            "p_end": [s.p_end for s in scored],
            "greedy_end": [s.greedy_end for s in scored],
        }
        p.update(_rule_metrics(p["scores"], p["scores"]["greedy_end"]))
    if "calibration" not in p:
        own = _score(args, base, out, calibration_examples(args.data, dataset, args.calibrate), f"calibrate {dataset}")
        cal = calibrate([ScoredExample(s.conversation_id, s.complete, s.p_end, s.greedy_end) for s in own])
        t = cal["p_end_threshold"]
        p["calibration"] = {
            "conversations": cal["conversations"],
            "examples": cal["examples"],
            "p_end_threshold": t,
            "recommended_rule": cal["recommended_rule"],
        }
        scores = p["scores"]
        p["threshold"] = None if t is None else _rule_metrics(scores, [x >= t for x in scores["p_end"]])
    labels, p_end = p["scores"]["complete"], p["scores"]["p_end"]
    p["p_end_median"] = {
        "complete": float(np.median([x for x, y in zip(p_end, labels, strict=True) if y])),
        "cut": float(np.median([x for x, y in zip(p_end, labels, strict=True) if not y])),
    }
    return p


def run(args: argparse.Namespace) -> dict[str, Any]:
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "lodo.json"
    doc = open_points(path, "python -m adapters.evaluation.lodo")
    doc["bases"] = list(args.bases)
    doc["datasets"] = list(args.datasets)
    doc["per_dataset"], doc["test_per_label"], doc["calibrate"] = args.per_dataset, args.test, args.calibrate
    for dataset in args.datasets:
        for name, base in args.bases.items():
            key = f"{name}/{dataset}"
            done = doc["points"].get(key, {})
            if all(k in done for k in ("steps", "scores", "calibration")):
                continue
            log.info("adapters.lodo.point", base=name, held_out=dataset)
            doc["points"][key] = point(args, name, base, dataset, done)
            save_points(path, doc)
    save_points(path, doc)
    from adapters.evaluation.lodo_report import write_lodo_report

    write_lodo_report(args.out, doc)
    return doc


def base_argument(value: str) -> tuple[str, Path]:
    """``--base NAME=DIR`` (``~`` in DIR is the home directory, also when the shell left it)."""
    name, sep, directory = value.partition("=")
    if not sep or not name or not directory:
        raise argparse.ArgumentTypeError(f"expected NAME=DIR, got {value!r}")
    return name, Path(directory).expanduser()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m adapters.evaluation.lodo", description=__doc__)
    p.add_argument("--data", type=Path, required=True, help="output of `adapters prepare`")
    p.add_argument("--base", dest="base_list", type=base_argument, action="append", required=True, help="NAME=DIR")
    p.add_argument("--datasets", type=lambda v: v.split(","), required=True)
    p.add_argument("--per-dataset", type=int, default=8, help="train-side conversations of each other data set")
    p.add_argument("--test", type=int, default=20, help="test examples of each label per held-out data set")
    p.add_argument(
        "--calibrate",
        type=int,
        default=16,
        help="held-out data set's train-side conversations (unlabelled) a P(end) threshold is calibrated on",
    )
    p.add_argument("--recipe-from", type=Path, default=ARTIFACTS / "completion", help="adapter whose recipe is used")
    p.add_argument("--epochs", type=float, default=None)
    p.add_argument("--lr", type=float, default=None)
    p.add_argument("--work", type=Path, required=True, help="adapters are trained into WORK/<base>/<data set>")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    args.bases = dict(args.base_list)
    if len(args.bases) != len(args.base_list):
        p.error("--base names must differ")
    if min(args.per_dataset, args.test, args.calibrate) < 1:
        p.error("--per-dataset, --test and --calibrate must be at least 1")
    for name, base in args.bases.items():
        if not (base / "config.json").is_file():
            p.error(f"--base {name}: no model directory at {base}")
    if len(args.datasets) < 2:
        p.error("--datasets needs at least two data sets (one is held out)")
    missing = [d for d in args.datasets if not (args.data / d / "test.jsonl").is_file()]
    if missing:
        p.error(f"not prepared under {args.data}: {', '.join(missing)}")
    try:
        run(args)
    except DataError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
