"""The drift benchmark's own pieces (``tests/bench/bench_drift.py``), without a server or datasets.

Its score cache is read back from disk, so a cut-short, foreign or hostile line must be scored
again rather than trusted; and its analysis must tell a window of the baseline's own distribution
from one of another, through the sidecar's drift statistic.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from tests.bench.bench_drift import analyse, baseline_of, draw, parse, read_cache, window_distances


def test_the_cache_keeps_only_well_formed_rows_of_this_fingerprint(tmp_path: Path) -> None:
    good = {"fp": "f1", "dataset": "sgd", "id": "a", "p_end": 0.25, "complete": True}
    failed = {"fp": "f1", "dataset": "sgd", "id": "b", "error": "prompt_too_long"}
    lines = [
        json.dumps(good),
        json.dumps(failed),
        json.dumps({**good, "id": "c", "fp": "other-adapter"}),
        json.dumps({**good, "id": "d", "p_end": 1.5}),
        json.dumps({**good, "id": "e", "p_end": "NaN"}),
        json.dumps({**good, "id": "f", "p_end": True}),
        json.dumps({**good, "id": "g", "complete": "yes"}),
        json.dumps({**good, "id": 7}),
        json.dumps({k: v for k, v in good.items() if k != "dataset"}),
        '{"fp": "f1", "dataset": "sgd", "id": "h", "p_e',  # cut short by an interrupted run
        "[1, 2]",
        "x" * 100_000,
    ]
    cache = tmp_path / "scores.jsonl"
    cache.write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert read_cache(cache, "f1") == {("sgd", "a"): good, ("sgd", "b"): failed}
    assert read_cache(tmp_path / "missing.jsonl", "f1") == {}


def test_the_baseline_is_the_onboarding_one() -> None:
    verdicts = [(i / 99, i % 4 == 0) for i in range(100)]
    base = baseline_of(verdicts)
    assert base.completion_rate == 0.25
    assert base.untrusted_share == 0.0
    assert base.p_end_quantiles is not None and len(base.p_end_quantiles) == 21
    assert base.p_end_quantiles[0] == 0.0 and base.p_end_quantiles[-1] == 1.0
    # the same verdicts as the window: every distance is about 0
    assert window_distances(verdicts, base, 256)["p_end"] < 0.02
    assert window_distances(verdicts, base, 256)["completion_rate"] == 0.0


def test_a_draw_is_without_replacement_where_the_pool_allows() -> None:
    rng = random.Random(0)
    picked, replaced = draw(list(range(300)), 256, rng)
    assert not replaced and len(set(picked)) == 256
    picked, replaced = draw(list(range(50)), 256, rng)
    assert replaced and len(picked) == 256 and set(picked) <= set(range(50))


def test_the_analysis_separates_another_distribution() -> None:
    rng = random.Random(1)
    scores = {
        "home": [(rng.betavariate(2, 5), rng.random() < 0.8) for _ in range(600)],
        "away": [(rng.betavariate(5, 2), rng.random() < 0.3) for _ in range(600)],
    }
    args = parse(["--baselines", "100", "--windows", "256", "--trials", "60", "--cross-trials", "30"])
    report, raw = analyse(scores, args)
    home = report["home/N=100/W=256"]
    assert not home["window_with_replacement"]
    assert home["false_alarm"]["any"]["above"] < 0.05
    assert home["detection"]["away"]["any"]["above"] == 1.0
    assert home["detection"]["away"]["p_end"]["p50"] > 0.5
    assert len(raw["home/N=100/W=256"]["same"]["p_end"]) == 60


def test_a_home_too_small_for_its_baseline_is_skipped() -> None:
    scores = {"tiny": [(0.5, True)] * 120, "other": [(0.1, False)] * 300}
    args = parse(["--baselines", "50", "--windows", "256", "--trials", "5", "--cross-trials", "5"])
    report, _ = analyse(scores, args)
    assert "skipped" in report["tiny/N=50/W=256"]
    assert report["other/N=50/W=256"]["detection"]["tiny"]["any"]["above"] == 1.0


@pytest.mark.parametrize("bad", [["--baselines", "x"], ["--windows", ""]])
def test_malformed_sizes_are_refused(bad: list[str]) -> None:
    with pytest.raises(SystemExit):
        parse(bad)
