"""How often the adapter-drift signal crosses the alert's threshold on real traffic. No assertions.

The bundled model and completion adapter are served on the local vLLM CPU server (or ``--url``, a
running server with the same artifacts, as ``sidecar demo`` serves them) and every conversation's
*final* verdict (the whole conversation: P(end) and complete) is scored through
:meth:`Scorers.score_adapter <sidecar.scoring.scorers.Scorers.score_adapter>`, the prompt and
scorer of the live hooks. Only the adapters' held-out *test* side of each dataset is used
(``adapters.data.conversations.split_of``): the bundled adapter was trained on the other half,
and an onboarding baseline is held back from training too. Scores are cached in
``<out>/scores.jsonl`` under the adapter's sha256 and the prompt window, so reruns only analyse.

Per home dataset H and baseline size N, each trial draws N conversations of H as the held-back
slice, builds the baseline with ``adapters.onboarding.baseline.drift_baseline`` (the code
``adapters onboard`` writes the manifest's baseline with) and fills a
:class:`~sidecar.scoring.drift.DriftWindow` with W other conversations of H (no conversation twice
in a trial; drawn with replacement only where the pool is smaller than W, and flagged): the
distances are what the sidecar exports, and the share of trials with any signal above the
threshold is the false-alarm rate per window. Windows from each other dataset against the same
baseline give the detection rate. Writes ``report.json`` and ``distances.png`` under ``--out``.

    SIDECAR_SHARED_DIR=../shared nice -n 10 .venv/bin/python -m tests.bench.bench_drift
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import random
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from prometheus_client import CollectorRegistry

from adapters.data.conversations import from_record, split_of, stable_unit
from adapters.onboarding.baseline import drift_baseline
from sidecar.errors import PermanentError
from sidecar.scoring.config import DriftBaselineConfig
from sidecar.scoring.drift import DriftWindow, Signal
from sidecar.scoring.scorers import Scorers, failure_reason
from sidecar.tools.demo import models
from sidecar.transcript.dataset import ReadLimits, ReadStats, read_conversations
from sidecar.transcript.model import Message, count_turns
from tests.support.bundled_vllm import BundledVllm

DATASETS = ("sgd", "multiwoz", "star", "taubench_airline", "optimouse")
SIGNALS: tuple[Signal, ...] = (
    "p_end",
    "completion_rate",
)  # untrusted_share is 0 for a validated adapter: nothing to measure
SWEEP = (0.15, 0.2, 0.25, 0.3, 0.35, 0.4)  # thresholds the report also gives the rates at
REPORTS = Path(__file__).resolve().parent / "reports" / "drift"


def shared_dir() -> Path:
    env = os.environ.get("SIDECAR_SHARED_DIR")
    return Path(env) if env else Path(__file__).resolve().parents[3] / "shared"


def load_test_side(name: str, limit: int) -> list[tuple[str, tuple[Message, ...]]]:
    """Up to ``limit`` conversations of the dataset's held-out test side, in a stable random order."""
    path = shared_dir() / "datasets" / name / "dev.jsonl.gz"
    stats = ReadStats()
    found = []
    for rec in read_conversations(path, stats=stats, limits=ReadLimits(flag="--datasets")):
        if count_turns(rec.messages) == 0 or split_of(from_record(rec)) != "test":
            continue
        found.append((stable_unit(rec.conversation_id, "bench-drift"), rec.conversation_id, rec.messages))
    found.sort(key=lambda x: x[0])
    return [(cid, msgs) for _, cid, msgs in found[:limit]]


def fingerprint(cfg_adapter_dir: Path, max_prompt_tokens: int, truncation: str) -> str:
    """What the cached scores depend on: the adapter's weights and the prompt window."""
    manifest = json.loads((cfg_adapter_dir / "manifest.json").read_text(encoding="utf-8"))
    key = f"{manifest.get('adapter_sha256')}:{max_prompt_tokens}:{truncation}"
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def read_cache(path: Path, fp: str) -> dict[tuple[str, str], dict[str, Any]]:
    out: dict[tuple[str, str], dict[str, Any]] = {}
    if not path.exists():
        return out
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut short by an interrupted run
        if not isinstance(row, dict) or row.get("fp") != fp:
            continue  # another adapter or window, or not a row: scored again
        ds, cid, p = row.get("dataset"), row.get("id"), row.get("p_end")
        scored = (
            isinstance(p, float | int)
            and not isinstance(p, bool)
            and 0.0 <= p <= 1.0
            and isinstance(row.get("complete"), bool)
        )
        if isinstance(ds, str) and isinstance(cid, str) and (scored or isinstance(row.get("error"), str)):
            out[(ds, cid)] = row
    return out


async def score_all(
    bundled: BundledVllm,
    todo: list[tuple[str, str, tuple[Message, ...]]],
    cache: Path,
    fp: str,
    concurrency: int,
) -> None:
    """Score the final verdict of every conversation in ``todo``, appending rows to ``cache``."""
    cfg = bundled.scoring_config()
    adapter = cfg.default_agent.adapter
    assert adapter is not None
    scorers = Scorers.from_config(cfg, CollectorRegistry())
    await scorers.start()
    t0 = time.monotonic()
    try:
        with cache.open("a", encoding="utf-8") as fh:
            for i in range(0, len(todo), concurrency):
                chunk = todo[i : i + concurrency]

                async def one(msgs: Sequence[Message]) -> dict[str, Any]:
                    try:
                        s = await scorers.score_adapter(msgs, adapter)
                    except PermanentError as exc:
                        return {"error": failure_reason(exc)}
                    return {"p_end": s.p_end, "complete": s.complete}

                results = await asyncio.gather(*(one(m) for _, _, m in chunk))
                for (ds, cid, _), res in zip(chunk, results, strict=True):
                    fh.write(json.dumps({"fp": fp, "dataset": ds, "id": cid, **res}) + "\n")
                fh.flush()
                done = i + len(chunk)
                if done % (concurrency * 25) < concurrency or done == len(todo):
                    rate = done / (time.monotonic() - t0)
                    print(f"scored {done}/{len(todo)} ({rate:.1f}/s)", file=sys.stderr, flush=True)
    finally:
        await scorers.stop()


def baseline_of(verdicts: Sequence[tuple[float, bool]]) -> DriftBaselineConfig:
    """The baseline ``adapters onboard`` would export for this held-back slice (greedy rule, trusted).

    ``validation`` is the part of ``onboard.validate``'s document the baseline reads: the whole
    conversations' P(end) and the greedy rule's recall of the complete class on them (the share of
    whole conversations it calls complete)."""
    validation = {
        "rule": "greedy",
        "trusted": True,
        "p_end": {"complete": [p for p, _ in verdicts]},
        "after": {"greedy": {"complete": {"recall": sum(c for _, c in verdicts) / len(verdicts)}}},
    }
    return DriftBaselineConfig.model_validate(drift_baseline(validation))


def window_distances(
    verdicts: Sequence[tuple[float, bool]], baseline: DriftBaselineConfig, size: int
) -> dict[str, float]:
    window = DriftWindow(size)
    for p, c in verdicts:
        window.add(p, complete=c, untrusted=False)
    d = window.distances(baseline)
    return {s: d[s] for s in SIGNALS}


def draw(pool: Sequence[Any], k: int, rng: random.Random) -> tuple[list[Any], bool]:
    """``k`` items without replacement when the pool allows, else with replacement (flagged True)."""
    if len(pool) >= k:
        return rng.sample(list(pool), k), False
    return [rng.choice(pool) for _ in range(k)], True


def summary(values: Sequence[float], threshold: float) -> dict[str, float]:
    a = np.asarray(values)
    return {
        "p50": round(float(np.percentile(a, 50)), 4),
        "p90": round(float(np.percentile(a, 90)), 4),
        "p99": round(float(np.percentile(a, 99)), 4),
        "max": round(float(a.max()), 4),
        "above": round(float((a > threshold).mean()), 4),
    }


def analyse(
    scores: dict[str, list[tuple[float, bool]]], args: argparse.Namespace
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The report's figures, and the raw distances the plot draws."""
    rng = random.Random(args.seed)
    t = args.threshold
    report: dict[str, Any] = {}
    raw: dict[str, Any] = {}
    for home, pool in scores.items():
        for n in args.baselines:
            for w in args.windows:
                key = f"{home}/N={n}/W={w}"
                if len(pool) < n + args.min_rest:
                    report[key] = {"skipped": f"{len(pool)} test-side conversations, need N + {args.min_rest}"}
                    continue
                same: dict[str, list[float]] = {s: [] for s in (*SIGNALS, "any")}
                other: dict[str, dict[str, list[float]]] = {o: {s: [] for s in (*SIGNALS, "any")} for o in scores}
                replaced = False
                for trial in range(args.trials):
                    shuffled = rng.sample(pool, len(pool))
                    base = baseline_of(shuffled[:n])
                    window, flag = draw(shuffled[n:], w, rng)
                    replaced |= flag
                    d = window_distances(window, base, w)
                    for s in SIGNALS:
                        same[s].append(d[s])
                    same["any"].append(max(d.values()))
                    if trial >= args.cross_trials:
                        continue
                    for o, opool in scores.items():
                        if o == home:
                            continue
                        window, _ = draw(opool, w, rng)
                        d = window_distances(window, base, w)
                        for s in SIGNALS:
                            other[o][s].append(d[s])
                        other[o]["any"].append(max(d.values()))
                report[key] = {
                    "home_pool": len(pool),
                    "window_with_replacement": replaced,
                    "false_alarm": {s: summary(v, t) for s, v in same.items()},
                    # the threshold at or below which 1 % / 0.1 % of same-agent windows fall above
                    "threshold_for_1pct": round(float(np.percentile(same["any"], 99)), 4),
                    "threshold_for_0.1pct": round(float(np.percentile(same["any"], 99.9)), 4),
                    "detection": {o: {s: summary(v, t) for s, v in d.items()} for o, d in other.items() if d["any"]},
                    # share of windows with any signal above each threshold: same dataset, then others
                    "sweep": {
                        str(x): {
                            "false_alarm": round(float(np.mean(np.asarray(same["any"]) > x)), 4),
                            **{
                                o: round(float(np.mean(np.asarray(d["any"]) > x)), 4)
                                for o, d in other.items()
                                if d["any"]
                            },
                        }
                        for x in SWEEP
                    },
                }
                raw[key] = {"same": same, "other": {o: d for o, d in other.items() if d["any"]}}
    return report, raw


def table(report: dict[str, Any], threshold: float) -> str:
    rows = [
        f"| home / baseline N / window W | false alarms (any > {threshold}) | p_end p50 / p99 | "
        "completion p50 / p99 | threshold for 1 % | detection (any) per other dataset |",
        "|---|---|---|---|---|---|",
    ]
    for key, r in report.items():
        if "skipped" in r:
            rows.append(f"| {key} | skipped: {r['skipped']} | | | | |")
            continue
        fa = r["false_alarm"]
        det = ", ".join(f"{o} {d['any']['above']:.2f}" for o, d in r["detection"].items())
        flag = " (window drawn with replacement)" if r["window_with_replacement"] else ""
        rows.append(
            f"| {key}{flag} | {fa['any']['above']:.3f} | {fa['p_end']['p50']:.3f} / {fa['p_end']['p99']:.3f} | "
            f"{fa['completion_rate']['p50']:.3f} / {fa['completion_rate']['p99']:.3f} | "
            f"{r['threshold_for_1pct']:.3f} | {det} |"
        )
    return "\n".join(rows)


def plot(raw: dict[str, Any], threshold: float, n: int, w: int, dest: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = [k for k in raw if k.endswith(f"/N={n}/W={w}")]
    if not keys:
        return
    fig, axes = plt.subplots(len(SIGNALS), len(keys), figsize=(2.6 * len(keys), 4.4), squeeze=False)
    bins = np.linspace(0, 1, 41)
    for col, key in enumerate(keys):
        for row, s in enumerate(SIGNALS):
            ax = axes[row][col]
            ax.hist(raw[key]["same"][s], bins=bins, alpha=0.7, density=True, label="same dataset")
            cross = [v for d in raw[key]["other"].values() for v in d[s]]
            if cross:
                ax.hist(cross, bins=bins, alpha=0.5, density=True, label="other datasets")
            ax.axvline(threshold, color="red", lw=1)
            ax.set_yticks([])
            ax.tick_params(labelsize=7)
            if row == 0:
                ax.set_title(key.split("/")[0], fontsize=8)
            if col == 0:
                ax.set_ylabel(s, fontsize=8)
    axes[0][0].legend(fontsize=6)
    fig.suptitle(f"drift distance, baseline N={n}, window W={w}; red: alert threshold {threshold}", fontsize=9)
    fig.tight_layout()
    fig.savefig(dest, dpi=80)
    plt.close(fig)


async def score_on_server(
    url: str | None, todo: list[tuple[str, str, tuple[Message, ...]]], cache: Path, fp: str, concurrency: int
) -> None:
    """Score ``todo`` on the server at ``url``, else on a local one started for the purpose."""
    if url:
        await score_all(BundledVllm(url.rstrip("/")), todo, cache, fp, concurrency)
        return
    server = models.local_server(Path(tempfile.mkdtemp()) / "vllm.log")
    server.start()
    try:
        await server.wait_ready()
        await score_all(BundledVllm(server.root_url), todo, cache, fp, concurrency)
    finally:
        server.stop()


def main(args: argparse.Namespace) -> dict[str, Any]:
    t0 = time.monotonic()
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    found = models.bundled_model()
    if found is None:
        raise SystemExit("no bundled model under adapters/artifacts")
    base_dir, adapter_dir = found
    cfg = models.demo_scoring_config("http://unused/v1", base_dir, adapter_dir)
    fp = fingerprint(adapter_dir, cfg["max_prompt_tokens"], cfg["prompt_truncation"])
    convs = {name: load_test_side(name, args.per_dataset) for name in args.datasets}
    cache = out / "scores.jsonl"
    cached = read_cache(cache, fp)
    todo = [(ds, cid, msgs) for ds, items in convs.items() for cid, msgs in items if (ds, cid) not in cached]
    print(
        f"{sum(map(len, convs.values()))} conversations ({', '.join(f'{k} {len(v)}' for k, v in convs.items())}), "
        f"{len(todo)} to score",
        file=sys.stderr,
        flush=True,
    )
    if todo:
        asyncio.run(score_on_server(args.url, todo, cache, fp, args.concurrency))
        cached = read_cache(cache, fp)
    scores: dict[str, list[tuple[float, bool]]] = {}
    errors: dict[str, int] = {}
    for ds, items in convs.items():
        rows = [cached[(ds, cid)] for cid, _ in items]
        scores[ds] = [(float(r["p_end"]), bool(r["complete"])) for r in rows if "error" not in r]
        errors[ds] = sum("error" in r for r in rows)
    scoring_seconds = time.monotonic() - t0
    report, raw = analyse(scores, args)
    plot(raw, args.threshold, args.plot_baseline, max(args.windows), out / "distances.png")
    doc = {
        "threshold": args.threshold,
        "trials": args.trials,
        "cross_trials": args.cross_trials,
        "seed": args.seed,
        "conversations": {ds: len(v) for ds, v in scores.items()},
        "scoring_errors": errors,
        "scored_this_run": len(todo),  # 0 when every score came from the cache
        "whole_conversation_complete_share": {
            ds: round(sum(c for _, c in v) / len(v), 4) for ds, v in scores.items() if v
        },
        "whole_conversation_p_end_median": {
            ds: round(float(np.median([p for p, _ in v])), 4) for ds, v in scores.items() if v
        },
        "results": report,
        "seconds": {"load_and_score": round(scoring_seconds, 1), "total": round(time.monotonic() - t0, 1)},
    }
    (out / "report.json").write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    print(table(report, args.threshold))
    return doc


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ints = lambda s: [int(x) for x in s.split(",")]  # noqa: E731
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--datasets", type=lambda s: s.split(","), default=list(DATASETS))
    p.add_argument("--per-dataset", type=int, default=1500, help="test-side conversations scored per dataset")
    p.add_argument("--baselines", type=ints, default=[50, 100, 200], help="held-back slice sizes N")
    p.add_argument("--windows", type=ints, default=[256, 100], help="window sizes W (256: full, 100: minVerdicts)")
    p.add_argument("--min-rest", type=int, default=100, help="a home needs N + this many conversations")
    p.add_argument("--trials", type=int, default=400, help="same-dataset windows per home, N and W")
    p.add_argument("--cross-trials", type=int, default=100, help="windows per other dataset")
    p.add_argument("--threshold", type=float, default=0.3)
    p.add_argument("--plot-baseline", type=int, default=100, help="the N the PNG draws")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--url", default=None, help="root URL of a running server with the bundled model")
    p.add_argument("--out", type=Path, default=REPORTS)
    return p.parse_args(argv)


if __name__ == "__main__":
    result = main(parse())
    print(json.dumps({k: result[k] for k in ("conversations", "scoring_errors", "seconds")}), file=sys.stderr)
