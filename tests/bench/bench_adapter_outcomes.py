"""Does a trained completion adapter's P(end) predict failure? ``bench_uncertainty``'s P(end) rows,
with an adapter the bench trains in place of the zero-shot instruct prompt.

For each base (``--base NAME=DIR``, a directory with the end tag, as ``adapters add-end-tag``
writes it), a LoRA adapter is trained with the bundled adapter's recipe (its manifest). It sees the
first ``--per-dataset`` train-side conversations of each ``--train-on`` data set (the output of
``adapters prepare`` in ``--data``), and never STAR or tau-bench. Then P(end) of every full
transcript is scored in-process, on the ids the sidecar sends (the recipe's tail window, messages
capped), with the adapter and with the base alone.

The conversations are the ones ``bench_uncertainty`` draws with the same ``--tau`` and ``--star``:
tau-bench airline dev, and a STAR dev subset (a third disconnected, a third user-reported failures,
a third successes), minus the bundled sample's. Outcomes (failure positive) and intervals are that
bench's: ROC-AUC of -P(end) with a 95 % bootstrap over conversations, beside the user-turn count as
a baseline. Trained adapters and scores are kept in ``--work``: a rerun only does what is missing.

    SIDECAR_SHARED_DIR=../shared .venv/bin/python -m tests.bench.bench_adapter_outcomes \\
        --data build/lodo-data --base toy=adapters/artifacts/base \\
        --base gemma3-270m=~/.cache/sidecar/gemma3-270m-1.0.0/base-end \\
        --train-on sgd,multiwoz,optimouse --per-dataset 10 --tau 40 --star 60
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from adapters.evaluation.lodo import base_argument
from adapters.serving.manifest import recorded_command
from sidecar.tools.eval.dataset import EvalConversation, read_dataset
from sidecar.transcript.model import count_turns
from tests.bench.bench_uncertainty import REPORTS, SAMPLE, shared_sets
from tests.bench.bench_uncertainty_stats import OUTCOMES, auc_ci

REPO = Path(__file__).resolve().parents[2]
RECIPE_FROM = REPO / "adapters" / "artifacts" / "completion"
MODELS = ("adapter", "base alone")


def read_cache(path: Path) -> dict[str, dict[str, float]]:
    """Scores an earlier run kept: only probabilities, keyed by model and conversation; a file that
    is not such a map (cut short, foreign) is scored again rather than trusted."""
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return {}
    if not isinstance(raw, dict):
        return {}
    return {
        str(key): {
            str(cid): float(p)
            for cid, p in scored.items()
            if isinstance(p, float | int) and not isinstance(p, bool) and 0.0 <= p <= 1.0
        }
        for key, scored in raw.items()
        if isinstance(scored, dict)
    }


def write_cache(path: Path, cache: dict[str, dict[str, float]]) -> None:
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps(cache) + "\n", encoding="utf-8")
    partial.replace(path)


def conversations(star: int, tau: int | None) -> dict[str, list[EvalConversation]]:
    sample, _ = read_dataset(SAMPLE, max_bytes=64 * 1024 * 1024)
    return shared_sets(star, {c.conversation_id for c in sample}, tau)


def train(base: Path, data: Path, datasets: list[str], per_dataset: int, out: Path) -> dict[str, Any]:
    """The adapter of one base, trained once: a rerun reads what the first run recorded."""
    from adapters.onboarding.cli import inherited_recipe
    from adapters.training.lora import train_lora

    record = out / "bench-training.json"
    if record.is_file() and (out / "adapter_config.json").is_file():
        return dict(json.loads(record.read_text()))
    t0 = time.monotonic()
    trained = train_lora(data, datasets, base, out, inherited_recipe(RECIPE_FROM, {}), max_per_dataset=per_dataset)
    info = {"trained_on": trained["per_dataset"], "steps": trained["steps"], "seconds": round(time.monotonic() - t0, 1)}
    record.write_text(json.dumps(info) + "\n")
    return info


def p_end(base: Path, adapter: Path | None, convs: list[EvalConversation], desc: str) -> dict[str, float]:
    from adapters.onboarding.cli import inherited_recipe
    from adapters.onboarding.onboard import score_examples

    recipe = inherited_recipe(RECIPE_FROM, {})
    scored = score_examples(
        base,
        adapter,
        [(c.conversation_id, list(c.messages), True) for c in convs],
        max_context_tokens=recipe.max_context_tokens,
        max_message_tokens=recipe.max_message_tokens,
        desc=desc,
    )
    return {s.conversation_id: s.p_end for s in scored}


def outcome_rows(
    sets: dict[str, list[EvalConversation]], scores: dict[str, dict[str, float]], n_boot: int
) -> list[dict[str, Any]]:
    """One row per outcome and statistic: -P(end) of each base and model, and the user turns."""
    rows = []
    for set_name, convs in sets.items():
        for outcome, label in OUTCOMES.items():
            labelled = [(c, label(dict(c.labels))) for c in convs if label(dict(c.labels)) is not None]
            if not labelled:
                continue
            y = [bool(v) for _, v in labelled]
            ids = [c.conversation_id for c, _ in labelled]
            statistics = {f"{key}: -P(end)": [-scored[i] for i in ids] for key, scored in scores.items()}
            statistics["baseline: user turns"] = [float(count_turns(c.messages)) for c, _ in labelled]
            for name, values in statistics.items():
                rows.append({"set": set_name, "outcome": outcome, "statistic": name, **auc_ci(y, values, ids, n_boot)})
    return rows


def markdown(report: dict[str, Any]) -> str:
    def cell(r: dict[str, Any]) -> str:
        return "n/a" if r["auc"] is None else f"{r['auc']:.2f} ({r['lo']:.2f}-{r['hi']:.2f})"

    lines = [
        "# A trained completion adapter's P(end) against conversation outcomes",
        "",
        f"Command: `{report['command']}`",
        "",
        f"Adapters trained on {', '.join(report['train_on'])} ({report['per_dataset']} train-side conversations "
        "each; never STAR or tau-bench), the bundled adapter's recipe. P(end) of the full transcript, in-process. "
        "ROC-AUC with failure as the positive class and its 95 % bootstrap interval over conversations.",
        "",
        "| base | trained on | training seconds |",
        "|---|---|---|",
    ]
    for base, t in report["training"].items():
        trained_on = ", ".join(f"{d} {n}" for d, n in t["trained_on"].items())
        lines.append(f"| {base} | {trained_on} | {t['seconds']} |")
    lines += ["", "| outcome (failed/succeeded) | statistic | ROC-AUC |", "|---|---|---|"]
    for r in report["auc"]:
        lines.append(f"| {r['outcome']} ({r['pos']}/{r['neg']}) | {r['statistic']} | {cell(r)} |")
    lines += ["", "P(end) medians by outcome:", "", "| outcome | model | failed | succeeded |", "|---|---|---|---|"]
    for m in report["medians"]:
        lines.append(f"| {m['outcome']} | {m['model']} | {m['failed']:.3g} | {m['succeeded']:.3g} |")
    lines += [
        "",
        f"This run took {report['seconds']:.0f} s; it reused what `--work` already held (trained adapters, "
        "scores), so only the first run's figure is the cost.",
        "",
    ]
    return "\n".join(lines)


def medians(sets: dict[str, list[EvalConversation]], scores: dict[str, dict[str, float]]) -> list[dict[str, Any]]:
    import numpy as np

    out = []
    for convs in sets.values():
        for outcome, label in OUTCOMES.items():
            labelled = [(c.conversation_id, label(dict(c.labels))) for c in convs if label(dict(c.labels)) is not None]
            if not labelled:
                continue
            for key, scored in scores.items():
                failed = [scored[i] for i, v in labelled if v]
                ok = [scored[i] for i, v in labelled if not v]
                if failed and ok:
                    out.append(
                        {
                            "outcome": outcome,
                            "model": key,
                            "failed": float(np.median(failed)),
                            "succeeded": float(np.median(ok)),
                        }
                    )
    return out


def plot(sets: dict[str, list[EvalConversation]], scores: dict[str, dict[str, float]], path: Path) -> None:
    """P(end) of failed against succeeded conversations, one panel per outcome, one row per model."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [
        (outcome, [(c.conversation_id, v) for c in convs if (v := label(dict(c.labels))) is not None])
        for convs in sets.values()
        for outcome, label in OUTCOMES.items()
    ]
    panels = [(o, labelled) for o, labelled in panels if labelled]
    keys = list(scores)
    fig, axes = plt.subplots(len(keys), len(panels), figsize=(4 * len(panels), 2.4 * len(keys)), squeeze=False)
    for row, key in enumerate(keys):
        for col, (outcome, labelled) in enumerate(panels):
            ax = axes[row][col]
            for x, (name, want) in enumerate((("failed", True), ("succeeded", False))):
                ys = [max(scores[key][i], 1e-12) for i, v in labelled if bool(v) is want]
                ax.scatter([x + (k % 7 - 3) * 0.03 for k in range(len(ys))], ys, s=10, alpha=0.6, label=name)
            ax.set_yscale("log")
            ax.set_xticks([0, 1], ["failed", "succeeded"])
            ax.set_title(f"{key}\n{outcome}", fontsize=8)
            if col == 0:
                ax.set_ylabel("P(end) of the full transcript")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", type=Path, required=True, help="output of `adapters prepare`")
    p.add_argument("--base", dest="bases", type=base_argument, action="append", required=True, help="NAME=DIR")
    p.add_argument("--train-on", type=lambda v: v.split(","), default=["sgd", "multiwoz", "optimouse"])
    p.add_argument("--per-dataset", type=int, default=10)
    p.add_argument("--tau", type=int, default=40)
    p.add_argument("--star", type=int, default=60)
    p.add_argument("--bootstrap", type=int, default=2000)
    p.add_argument("--work", type=Path, default=REPO / "build" / "bench-adapter-outcomes")
    p.add_argument("--out", type=Path, default=REPORTS / "adapter-outcomes")
    args = p.parse_args(argv)
    if min(args.per_dataset, args.tau, args.star, args.bootstrap) < 1:
        p.error("--per-dataset, --tau, --star and --bootstrap must be at least 1")
    refused = sorted({"star", "taubench_airline"} & set(args.train_on))
    if refused:
        p.error(f"--train-on must not hold the data sets the outcomes come from: {', '.join(refused)}")
    for name, base in args.bases:
        if not (base / "config.json").is_file():
            p.error(f"--base {name}: no model directory at {base}")
    sets = conversations(args.star, args.tau)
    if not sets:
        print("error: the shared corpora are needed (SIDECAR_SHARED_DIR)", file=sys.stderr)
        return 2
    t0 = time.monotonic()
    args.work.mkdir(parents=True, exist_ok=True)
    cache_path = args.work / "scores.json"
    cache = read_cache(cache_path)
    every = [c for convs in sets.values() for c in convs]
    training: dict[str, Any] = {}
    for name, base in args.bases:
        adapter = args.work / name
        training[name] = train(base, args.data, args.train_on, args.per_dataset, adapter)
        for model, chosen in zip(MODELS, (adapter, None), strict=True):
            key = f"{name}, {model}"
            missing = [c for c in every if c.conversation_id not in cache.get(key, {})]
            if missing:
                cache.setdefault(key, {}).update(p_end(base, chosen, missing, key))
                write_cache(cache_path, cache)
    scores = {f"{name}, {model}": cache[f"{name}, {model}"] for name, _ in args.bases for model in MODELS}
    report = {
        "command": recorded_command("python -m tests.bench.bench_adapter_outcomes", argv),
        "train_on": args.train_on,
        "per_dataset": args.per_dataset,
        "training": training,
        "conversations": {k: len(v) for k, v in sets.items()},
        "auc": outcome_rows(sets, scores, args.bootstrap),
        "medians": medians(sets, scores),
        "seconds": time.monotonic() - t0,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "report.json").write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    (args.out / "results.md").write_text(markdown(report), encoding="utf-8")
    plot(sets, scores, args.out / "p_end_by_outcome.png")
    print(markdown(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
