"""Do LLM-free goal names say what the goal is? Measured against the shared datasets' labels.

Usage (from the repository root)::

    nice -n 10 .venv/bin/python -m tests.bench.bench_goal_names \\
        [--datasets sgd multiwoz star] [--per-dataset 1500] [--cache DIR] [--json FILE]

Per dataset, on the seeded sample of ``tests.bench.bench_clustering`` (LLM-free summaries: the
users' own messages; ``meta`` is never read for them), local all-MiniLM-L6-v2 embeddings and
Algorithm 1 in the LLM-free mode with the default configuration, as the sidecar runs it. The
final clusters are then named three ways, from the same seeded sample of members and
non-members:

- **before**: the previous namer (the three words of highest member share minus non-member
  share, at least ``keyword_min_document_frequency`` members each), kept here as the baseline;
- **vs rest**: :func:`sidecar.clustering.naming.goal_name`, the cluster against one class of
  sampled non-members (what the merge loop's labels use);
- **after**: the names the run itself published, :func:`sidecar.clustering.naming.name_clusters`
  (each cluster against every other cluster).

Every name goes through what the sidecar publishes (``metric_label``, and ``unnamed`` under
``min_conversations_per_name`` conversations). Measure: the share of clusters whose published
name contains a key term of the cluster's majority label (SGD: service family such as
``RentalCars`` -> rental, cars; MultiWOZ: the domains of the domain set; STAR: the words of the
task such as ``bank_fraud_report``), words compared in their singular forms. The labels
are read from ``meta`` for scoring only. Nothing is tuned to these key terms: no synonym lists.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import re
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from sidecar.clustering.algorithm import ClusteringResult
from sidecar.clustering.config import ClusteringConfig
from sidecar.clustering.embed import SentenceTransformerEmbedder
from sidecar.clustering.llm import ExtractiveGoalLLM
from sidecar.clustering.model import UNNAMED, metric_label
from sidecar.clustering.naming import goal_name, stem
from sidecar.tools.clustering.offline import cluster_conversations
from tests.bench.bench_clustering import embed_cached, load, shared_dir

DATASETS = ("sgd", "multiwoz", "star")

# --------------------------------------------------------------------------------------------
# The previous namer, verbatim in behaviour: the baseline of the comparison.

_OLD_WORD = re.compile(r"[a-z][a-z'-]{2,24}")
_OLD_STOPWORDS_TEXT = """
    a about above after again against all also am an and any are aren't as at be because been before
    being below between both but by can can't cannot could couldn't did didn't do does doesn't doing
    don't down during each few for from further get got had hadn't has hasn't have haven't having he
    her here hers herself him himself his how i i'd i'll i'm i've if in into is isn't it it's its
    itself just let's like me more most much must my myself need needs no nor not now of off on once
    only or other ought our ours ourselves out over own please same shall she should shouldn't so
    some such than that that's the their theirs them themselves then there there's these they this
    those through to too under until up upon us very want wanted wants was wasn't we we'd we'll
    we're were weren't what what's when where which while who whom why will with won't would
    wouldn't you you'd you'll you're you've your yours yourself yes yeah okay ok thanks thank hi
    hello hey great good fine sure sounds perfect cool awesome alright right one two three four
    five also something anything else actually maybe really well know think going help look
    looking find give tell make see said say go way time day bye goodbye much many lot
"""
_OLD_STOPWORDS = frozenset(_OLD_STOPWORDS_TEXT.split())


def _old_keywords(text: str) -> set[str]:
    return {w.strip("'-") for w in _OLD_WORD.findall(text.lower()) if w not in _OLD_STOPWORDS} - {""}


def old_keyword_label(group: Sequence[str], not_in_group: Sequence[str], *, min_df: int) -> str:
    pos = Counter(w for s in group for w in _old_keywords(s))
    neg = Counter(w for s in not_in_group for w in _old_keywords(s))
    need = max(1, min_df)
    n_pos, n_neg = max(1, len(group)), max(1, len(not_in_group))
    scored = [(pos[w] / n_pos - neg[w] / n_neg + 0.01 * math.log1p(pos[w]), w) for w in pos if pos[w] >= need]
    scored.sort(key=lambda t: (-t[0], t[1]))
    words = [w for _, w in scored[:3]]
    return " / ".join(words) if words else "miscellaneous"


# --------------------------------------------------------------------------------------------
# Key terms of a known label, and the measure.


def _forms(word: str) -> set[str]:
    """A word's possible singular forms ("buses" -> bus, "houses" -> house, "cities" -> city)."""
    forms = {word, stem(word)}
    if len(word) > 4 and word.endswith("es"):
        forms |= {word[:-1], word[:-2]}
    if len(word) > 4 and word.endswith("ies"):
        forms.add(word[:-3] + "y")
    return forms


def key_terms(label: str) -> set[str]:
    """Words of a dataset label: ``RentalCars_1`` -> {rental, car}; ``hotel+train`` -> {hotel, train}."""
    spaced = re.sub(r"([a-z])([A-Z])", r"\1 \2", label)
    return {f for w in re.split(r"[^A-Za-z]+", spaced.lower()) if len(w) > 2 for f in _forms(w)}


def hit(name: str, label: str | None) -> bool:
    """Does the published ``name`` contain a key term of ``label``?"""
    if label is None or name == UNNAMED:
        return False
    return bool({f for w in re.split(r"[^a-z]+", name) for f in _forms(w)} & key_terms(label))


def published(label: str, size: int, cfg: ClusteringConfig) -> str:
    """What ``sidecar_goal_info`` would show for a cluster with this label and size."""
    return metric_label(label, cfg.max_label_chars) if size >= cfg.min_conversations_per_name else UNNAMED


def name_three_ways(
    summaries: list[str], res: ClusteringResult, cfg: ClusteringConfig
) -> tuple[list[str], list[str], list[str]]:
    """Before / vs-rest / after names of every cluster (after: the run's own labels)."""
    m = ExtractiveGoalLLM(cfg).describe_examples
    rng = np.random.default_rng(cfg.seed)
    before: list[str] = []
    vs_rest: list[str] = []
    for c in range(res.k):
        inside, outside = np.flatnonzero(res.assignments == c), np.flatnonzero(res.assignments != c)
        pos = [summaries[i] for i in rng.permutation(inside)[:m]]
        neg = [summaries[i] for i in rng.permutation(outside)[:m]]
        before.append(old_keyword_label(pos, neg, min_df=cfg.keyword_min_document_frequency))
        vs_rest.append(goal_name(pos, neg, min_df=cfg.keyword_min_document_frequency))
    return before, vs_rest, list(res.labels)


def one_dataset(name: str, n: int, cfg: ClusteringConfig, cache: Path | None) -> dict[str, Any]:
    from tests.bench.bench_clustering import GOALS

    summaries, goals = load(name, n, seed=0)
    vecs, _ = embed_cached(name, summaries, cache)
    t = time.perf_counter()
    res = asyncio.run(
        cluster_conversations(
            summaries, vecs, cfg, ExtractiveGoalLLM(cfg), SentenceTransformerEmbedder(), seed=cfg.seed
        )
    )
    cluster_seconds = time.perf_counter() - t
    t = time.perf_counter()
    names = name_three_ways(summaries, res, cfg)
    name_seconds = time.perf_counter() - t
    rows: list[dict[str, Any]] = []
    for c in range(res.k):
        members = [goals[i] for i in np.flatnonzero(res.assignments == c) if goals[i] is not None]
        majority = Counter(members).most_common(1)[0][0] if members else None
        shown = [published(v[c], res.sizes[c], cfg) for v in names]
        hits = [hit(s, majority) for s in shown]
        rows.append({"size": res.sizes[c], "majority": majority, "names": shown, "hits": hits})
    share = [sum(r["hits"][j] for r in rows) / max(1, len(rows)) for j in range(3)]
    # Content words per name ("and" and "/" not counted): a longer name has more chances to hit.
    words = [
        float(np.mean([len(re.findall(r"[a-z]+", r["names"][j].replace(" and ", " "))) for r in rows]))
        for j in range(3)
    ]
    return {
        "dataset": name,
        "n": len(summaries),
        "goal_field": GOALS[name][0],
        "k": res.k,
        "share": {"before": share[0], "vs_rest": share[1], "after": share[2]},
        "words_per_name": {"before": words[0], "vs_rest": words[1], "after": words[2]},
        "seconds": {"clustering": round(cluster_seconds, 2), "naming_three_ways": round(name_seconds, 3)},
        "clusters": rows,
    }


def table(results: list[dict[str, Any]]) -> str:
    lines = [
        "| dataset | n | clusters | name has a key term: before | vs rest | after | words per name: before / after |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        s, w = r["share"], r["words_per_name"]
        lines.append(
            f"| {r['dataset']} | {r['n']} | {r['k']} | {s['before']:.0%} | {s['vs_rest']:.0%} | **{s['after']:.0%}** "
            f"| {w['before']:.1f} / {w['after']:.1f} |"
        )
    return "\n".join(lines)


def examples(r: dict[str, Any], n: int) -> str:
    lines = [f"{r['dataset']}: majority label -> before | after"]
    for row in r["clusters"][:n]:
        lines.append(f"  {row['size']:>4}  {row['majority']!s:<24} {row['names'][0]:<40} | {row['names'][2]}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--datasets", nargs="+", default=list(DATASETS))
    ap.add_argument("--per-dataset", type=int, default=1500)
    ap.add_argument("--cache", type=Path, default=None, help="keep embeddings here between runs")
    ap.add_argument("--examples", type=int, default=8, help="largest clusters shown per dataset")
    ap.add_argument("--json", type=Path, default=None, help="write every figure and name here")
    args = ap.parse_args(argv)
    if not (shared_dir() / "datasets").is_dir():
        print(f"no datasets under {shared_dir()} (set SIDECAR_SHARED_DIR)", file=sys.stderr)
        return 2
    cfg = ClusteringConfig()
    results = [one_dataset(d, args.per_dataset, cfg, args.cache) for d in args.datasets]
    print(table(results))
    for r in results:
        print()
        print(examples(r, args.examples))
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
