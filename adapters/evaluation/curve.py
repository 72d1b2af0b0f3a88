"""The onboarding learning curve, leave one data set out (``python -m adapters.evaluation.curve``).

For each data set D: an adapter never trained on D (``--loo DIR/<D>``: ``train-lora`` on the other
data sets' train sides) is onboarded with ``adapters onboard``'s own pipeline on the first N of D's
train-side conversations (hash order, messages only: no label, no meta), for each N of ``--sizes``;
the result is scored on D's test side (``prepare``'s truncation-protocol examples) with both rules:
greedy, and the P(end) threshold the onboarding calibrated on its held-back slice. N = 0 is the
leave-one-out adapter as it is. Results are written after every point (a rerun skips done points;
onboarding steps resume too), then ``curve.json``, ``curve.md`` and ``curve.png``.

Test-side scoring is in-process (transformers + peft, float32, the sidecar's prompt ids), as
``adapters validate``; ``adapters eval`` checks the same path against vLLM for the bundled adapter.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import structlog

from adapters.data.conversations import messages_from_json
from adapters.errors import DataError
from adapters.evaluation.binary import flat_metrics
from adapters.evaluation.points import open_points, save_points
from adapters.onboarding.cli import inherited_recipe
from adapters.onboarding.onboard import OnboardSpec, run_onboarding, score_examples

log = structlog.get_logger()


def _lines(path: Path) -> list[dict[str, Any]]:
    with path.open(encoding="utf-8") as fh:
        return [json.loads(x) for x in fh if x.strip()]


def score_test_side(
    base: Path,
    adapter: Path,
    data: Path,
    dataset: str,
    *,
    ctx: int,
    cap: int | None,
    exclude: frozenset[str] = frozenset(),
) -> tuple[list[bool], list[float], list[bool]]:
    examples = [
        (e["conversation_id"], list(messages_from_json(e["messages"])), bool(e["complete"]))
        for e in _lines(data / dataset / "test.jsonl")
        if e["conversation_id"] not in exclude
    ]
    scored = score_examples(
        base, adapter, examples, max_context_tokens=ctx, max_message_tokens=cap, desc=f"test {dataset}"
    )
    return [s.complete for s in scored], [s.p_end for s in scored], [s.greedy_end for s in scored]


def point(args: argparse.Namespace, dataset: str, n: int) -> dict[str, Any]:
    loo = args.loo / dataset
    overrides = {"epochs": args.epochs, "decision_windows": args.decision_windows, "learning_rate": args.lr}
    recipe = inherited_recipe(loo, {k: v for k, v in overrides.items() if v is not None})
    ctx, cap = recipe.max_context_tokens, recipe.max_message_tokens
    if n == 0:
        labels, p_end, greedy = score_test_side(args.base, loo, args.data, dataset, ctx=ctx, cap=cap)
        return {
            "n": 0,
            "greedy": flat_metrics(labels, greedy, p_end),
            "threshold": None,
            "onboarding_seconds": 0.0,
            **_elsewhere(args, loo, ctx, cap),
        }
    work = args.work / dataset / str(n)
    work.mkdir(parents=True, exist_ok=True)
    train = _lines(args.data / dataset / "train.jsonl")[:n]
    with (work / "input.jsonl").open("w", encoding="utf-8") as fh:  # messages only: what an agent's traffic gives
        for rec in train:
            fh.write(json.dumps({"conversation_id": rec["conversation_id"], "turns": rec["messages"]}) + "\n")
    spec = OnboardSpec(
        agent=dataset,
        sources=(str(work / "input.jsonl"),),
        out=work / "onboard",
        base=args.base,
        init_adapter=loo,
        recipe=recipe,
        min_steps=args.min_steps,
        min_conversations=20,
        mix=tuple(args.mix),
    )
    t0 = time.monotonic()
    result = run_onboarding(spec)
    seconds = round(time.monotonic() - t0, 1)
    labels, p_end, greedy = score_test_side(
        args.base, work / "onboard" / "trained", args.data, dataset, ctx=ctx, cap=cap
    )
    steps = json.loads((work / "onboard" / "report.json").read_text())
    threshold = steps["validation"]["after"]["p_end_threshold"]  # calibrated, whichever rule was recommended
    return {
        "n": len(train),
        "greedy": flat_metrics(labels, greedy, p_end),
        "threshold": None if threshold is None else flat_metrics(labels, [p >= threshold for p in p_end], p_end),
        "p_end_threshold": threshold,
        "recommended_rule": steps["validation"]["after"]["recommended_rule"],
        "validation_f1": result["validation_f1"],
        "onboarding_seconds": seconds,
        "step_seconds": {k: v["seconds"] for k, v in steps["timings"].items()},
        "train_steps": steps["train"]["steps"],
        "held_back": steps["split"]["holdback"],
        "trained_on": steps["split"]["train"],
        "general_mixed_in": steps["split"]["general"],
        **_elsewhere(args, work / "onboard" / "trained", ctx, cap),
    }


def _elsewhere(args: argparse.Namespace, adapter: Path, ctx: int, cap: int | None) -> dict[str, Any]:
    """Greedy metrics on other data sets' test sides (forgetting). The demo sample's conversations, and
    any other mix's, are left out, so runs with and without ``--mix demo-sample`` score the same examples."""
    if not args.also_test:
        return {}
    from adapters.data.sources import open_source
    from adapters.onboarding.onboard import demo_sample

    specs = {demo_sample(), *(demo_sample() if s == "demo-sample" else s for s in args.mix)}
    mixed = frozenset(c.conversation_id for s in specs for c in open_source(s).conversations())
    out = {}
    for other in args.also_test:
        labels, p_end, greedy = score_test_side(args.base, adapter, args.data, other, ctx=ctx, cap=cap, exclude=mixed)
        out[other] = flat_metrics(labels, greedy, p_end)
    return {"elsewhere": out, "elsewhere_excluded_as_mixed": len(mixed)}


def ceilings(report: Path) -> dict[str, float]:
    if not report.exists():
        return {}
    doc = json.loads(report.read_text())
    return {
        d: r["protocol"]["supervised_classifier"]["complete"]["f1"]
        for d, r in doc["results"].items()
        if "protocol" in r
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "curve.json"
    doc = open_points(path, "python -m adapters.evaluation.curve")
    doc["ceilings"] = ceilings(args.ceilings)
    for dataset in args.datasets:
        available = sum(1 for _ in (args.data / dataset / "train.jsonl").open())
        for size in args.sizes:
            key = f"{dataset}/{size}"
            if key in doc["points"]:
                continue
            if size > available and any(s >= available for s in args.sizes if s < size):
                doc["points"][key] = {"n": available, "skipped": f"only {available} train-side conversations"}
                continue
            log.info("adapters.curve.point", dataset=dataset, size=size)
            doc["points"][key] = point(args, dataset, min(size, available))
            save_points(path, doc)
    save_points(path, doc)
    from adapters.evaluation.curve_report import write_curve_report

    write_curve_report(args.out, doc, args.datasets, args.sizes)
    return doc


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m adapters.evaluation.curve", description=__doc__)
    p.add_argument("--data", type=Path, required=True, help="output of `adapters prepare`")
    p.add_argument("--loo", type=Path, required=True, help="DIR/<dataset>: adapters never trained on it")
    p.add_argument("--base", type=Path, default=Path(__file__).resolve().parents[1] / "artifacts" / "base")
    p.add_argument("--datasets", type=lambda v: v.split(","), required=True)
    p.add_argument("--sizes", type=lambda v: [int(x) for x in v.split(",")], default=[0, 25, 50, 100, 200, 400])
    p.add_argument("--epochs", type=float, default=2.0)
    p.add_argument("--min-steps", type=int, default=40)
    p.add_argument("--decision-windows", type=int, default=None, help="default: the adapter's own recipe")
    p.add_argument("--lr", type=float, default=None, help="default: the adapter's own recipe")
    p.add_argument("--mix", action="append", default=[], help="general conversations mixed into onboarding")
    p.add_argument(
        "--also-test",
        type=lambda v: v.split(","),
        default=[],
        help="also score on these data sets' test sides (forgetting; demo-sample and mixed conversations left out)",
    )
    p.add_argument("--work", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--ceilings", type=Path, default=Path(__file__).resolve().parents[1] / "reports" / "report.json")
    args = p.parse_args(argv)
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))
    try:
        run(args)
    except DataError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
