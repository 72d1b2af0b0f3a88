"""``sidecar eval-alerts`` end to end on the bundled model (a real vLLM CPU server): 11 labelled
conversations of the bundled sample (STAR with both disconnects, tau-bench with both rewards) go
through the live hooks, escalation policy and stage. The report's counts are recomputed from the
per-conversation rows and from the input itself: a tree at every user turn, a stalled alert exactly
where the user spoke last, every alert counted once per outcome, the command recorded, and the
HTML page self-contained."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from sidecar.cli import main
from tests.support.bundled_vllm import BundledVllm

SAMPLE = Path(__file__).resolve().parents[2] / "sidecar" / "tools" / "demo" / "data" / "sample.jsonl.gz"


def subset(path: Path) -> dict[str, dict[str, Any]]:
    """Both STAR disconnects, 5 finished STAR dialogues, 2 tau-bench failures and 2 successes."""
    want = {("star", "DisconnectDuringDialogue"): 2, ("star", "Complete"): 5, ("tau", 0.0): 2, ("tau", 1.0): 2}
    taken: dict[tuple[str, Any], int] = {}
    kept: dict[str, dict[str, Any]] = {}
    with gzip.open(SAMPLE, "rt", encoding="utf-8") as src, path.open("w", encoding="utf-8") as dst:
        for line in src:
            rec = json.loads(line)
            meta = rec.get("meta", {})
            key = ("star", meta.get("completion_level")) if rec["source"] == "star" else ("tau", meta.get("reward"))
            if taken.get(key, 0) < want.get(key, 0):
                taken[key] = taken.get(key, 0) + 1
                kept[rec["conversation_id"]] = rec
                dst.write(line)
    assert taken == want
    return kept


@pytest.mark.slow
def test_replayed_alerts_are_counted_from_the_live_path(tmp_path: Path, bundled_vllm: BundledVllm) -> None:
    data = subset(tmp_path / "in.jsonl")
    cfg = bundled_vllm.scoring_config().model_dump(mode="json")
    cfg["vllm"]["max_concurrency"] = 8
    # Few trees here: the uncertain-turn window warms up on 20, not 50.
    alerting = {"policy": {"uncertainty": {"min_trees": 20, "window_trees": 200}}}
    conf = tmp_path / "sidecar.json"
    conf.write_text(json.dumps({"scoring": cfg, "alerting": alerting, "logging": {"level": "warning"}}))
    out = tmp_path / "out"
    argv = ["eval-alerts", str(tmp_path / "in.jsonl"), "--config", str(conf), "--out", str(out), "--rounds", "100"]
    assert main(argv) == 0

    rows = {r["id"]: r for r in map(json.loads, (out / "turns.jsonl").read_text().splitlines())}
    assert set(rows) == set(data)
    for cid, row in rows.items():
        users = sum(1 for t in data[cid]["turns"] if t["role"] == "user")
        assert row["turns"] == users and len(row["trees"]) == users  # a tree at every user message
        assert set(row["p_end"]) == {str(t) for t in range(1, users + 1)}  # a verdict at every closed turn
        stalled = [a for a in row["alerts"] if a[0] == "conversation_stalled"]
        assert bool(stalled) == (data[cid]["turns"][-1]["role"] == "user")  # idle end, user unanswered
        for kind, turn, lead_turns, _lead_messages in row["alerts"]:
            assert lead_turns == (0 if kind.startswith("conversation_") else users - turn)

    summary = json.loads((out / "alerts.json").read_text())
    assert summary["run"]["command"].startswith("sidecar eval-alerts ") and "--rounds 100" in summary["run"]["command"]
    found = summary["outcomes"]
    asked = any(isinstance(r.get("meta", {}).get("user_reported_task_success"), bool) for r in data.values())
    expected = {"STAR disconnect", "tau-bench reward < 1", "truncation (cut = abandoned)"}
    assert set(found) == expected | ({"STAR user-reported failure"} if asked else set())
    star = found["STAR disconnect"]["alerters"]
    assert (star["any alert"]["copies"], star["any alert"]["positives"]) == (7, 2)
    for kind in ("uncertain_turn", "conversation_incomplete", "conversation_stalled"):
        counted = sum(1 for r in rows.values() if r["source"] == "star" for a in r["alerts"] if a[0] == kind)
        assert star[kind]["alerts"] == counted
        baselines = star[kind]["baselines"]
        assert baselines["random"]["alerts"] == baselines["length"]["alerts"] == counted  # at the same count
    every = sum(len(r["alerts"]) + len(r["cut_alerts"]) for r in rows.values())
    assert found["truncation (cut = abandoned)"]["alerters"]["any alert"]["alerts"] == every
    page = (out / "alerts.html").read_text()
    assert "http://" not in page.replace("http://www.w3.org", "") and "<script" not in page
    assert (out / "figures" / "earliness.png").stat().st_size > 1000
    assert "STAR disconnect" in (out / "alerts.md").read_text()
    # Deciding again from the rows, without vLLM, gives the same figures.
    again = tmp_path / "again"
    assert main([*argv[:-4], "--out", str(again), "--rows", str(out), "--rounds", "100"]) == 0
    assert json.loads((again / "alerts.json").read_text())["outcomes"] == found
