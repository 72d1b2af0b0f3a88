"""``sidecar eval`` end to end on 50 real conversations of the bundled sample (STAR, MultiWOZ,
tau-bench) against the suite's real vLLM CPU server: every section of the report is there, its
numbers are the ones ``results.jsonl`` gives (recomputed here with scikit-learn), a resumed run
scores only what is missing, and headless Chromium opens the report offline without a console
error, drawing as many leaves as the rows hold."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from sklearn.metrics import accuracy_score, precision_recall_fscore_support, roc_auc_score

from sidecar.cli import main
from sidecar.tools.eval.report import fmt
from tests.support.vllm_server import VllmServer
from tests.trees.browser import open_page, png_size

SAMPLE = Path(__file__).resolve().parents[2] / "sidecar" / "tools" / "demo" / "data" / "sample.jsonl.gz"
PICK = {"star": 20, "multiwoz21_convlab2": 17, "taubench_airline": 13}
SECTIONS = ("run", "completion", "uncertainty", "top", "goals")


def subset(path: Path) -> list[str]:
    taken: dict[str, int] = {}
    ids = []
    with gzip.open(SAMPLE, "rt", encoding="utf-8") as src, path.open("w", encoding="utf-8") as dst:
        for line in src:
            rec = json.loads(line)
            if taken.get(rec["source"], 0) < PICK[rec["source"]]:
                taken[rec["source"]] = taken.get(rec["source"], 0) + 1
                ids.append(rec["conversation_id"])
                dst.write(line)
        dst.write("{this line is broken\n")
        dst.write(json.dumps({"conversation_id": "no-user", "turns": [{"role": "assistant", "content": "hi"}]}) + "\n")
    return ids


def config(path: Path, server: VllmServer) -> Path:
    path.write_text(
        json.dumps(
            {
                "scoring": {
                    "vllm": {"base_url": server.base_url, "base_model": server.base_model, "max_concurrency": 8},
                    "tokenizer": {"model_dir": str(server.model_dir)},
                    "default_agent": {"adapter": server.adapter_model},
                    "prompt_truncation": "tail",
                    "max_prompt_tokens": 512,
                    # Small trees: the suite's tiny model branches a lot, and this test is about the report.
                    "tree": {"alpha": 0.2, "max_depth_tokens": 12, "max_requests": 8},
                },
                "clustering": {"mode": "extractive"},
                # Short judge prompts: the tiny model's context is 2,048 tokens.
                "judge": {
                    "llm": {"base_url": server.base_url, "model": server.base_model, "max_tokens": 48},
                    "max_transcript_chars": 1500,
                    "max_message_chars": 300,
                },
                "logging": {"level": "warning"},
            }
        ),
        encoding="utf-8",
    )
    return path


def rows_of(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / "results.jsonl").read_text(encoding="utf-8").splitlines()]


def cells(html: str, label: str) -> list[str]:
    """The cells of the table row whose first cell is ``label``."""
    m = re.search(r"<tr><td>" + re.escape(label) + r"</td>(.*?)</tr>", html)
    assert m is not None, label
    return re.findall(r"<td>(.*?)</td>", m.group(1))


@pytest.mark.slow
def test_eval_report_on_the_bundled_sample(
    vllm_server: VllmServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "data.jsonl"
    ids = subset(data)
    cfg = config(tmp_path / "sidecar.yaml", vllm_server)
    out = tmp_path / "report"
    argv = ["eval", str(data), "--out", str(out), "--config", str(cfg)]
    assert main([*argv, "--goals", "off"]) == 0
    err = capsys.readouterr().err
    assert "50 conversations, 2 lines skipped (invalid_json 1, no_user_message 1)" in err

    # Resume: drop ten rows and tear the last line as a crash would; the rerun scores those ten only.
    lines = (out / "results.jsonl").read_text(encoding="utf-8").splitlines(keepends=True)
    (out / "results.jsonl").write_text("".join(lines[:40]) + lines[40][:40], encoding="utf-8")
    assert main([*argv, "--goals", "extractive"]) == 0
    assert "(10 scored now, 40 from earlier runs;" in capsys.readouterr().err
    rows = rows_of(out)
    assert sorted(r["id"] for r in rows) == sorted(ids) and len(rows) == 50

    html = (out / "report.html").read_text(encoding="utf-8")
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    for section in SECTIONS:
        assert f'<section id="{section}">' in html
    assert html.count('src="data:image/png;base64,') == 5
    assert not re.search(r'(src|href)="(https?:|//|file:)', html) and "<script" not in html

    # Completion: recomputed from the rows with scikit-learn, as the page prints it.
    ys, preds, scores = [], [], []
    for r in rows:
        for key, label in (("full", True), ("truncated", False)):
            v = r["completion"][key]
            if v is not None and "p_end" in v:
                ys.append(label)
                preds.append(v["complete"])
                scores.append(v["p_end"])
    _, _, f1, _ = precision_recall_fscore_support(ys, preds, labels=[True, False], zero_division=0)
    row = cells(html, "all (protocol)")
    assert row[0] == str(len(ys)) and row[3] == fmt(float(accuracy_score(ys, preds)))
    assert row[6] == fmt(float(f1[0])) and row[9] == fmt(float(f1[1]))
    assert row[10] == fmt(float(roc_auc_score(ys, scores)))
    assert summary["completion"]["overall"]["n"] == len(ys)
    for source in PICK:
        assert source in summary["completion"]["by_source"]

    # Uncertainty: one tree per conversation (the last user message), Figure 6's statistics.
    trees = [t for r in rows for t in r["trees"] if t.get("max_logprob") is not None]
    assert len(trees) + summary["uncertainty"]["errors"] == 50
    leaves_row = cells(html, "leaves")
    assert leaves_row[0] == str(len(trees)) and leaves_row[1] == fmt(float(np.mean([t["leaves"] for t in trees])))
    assert cells(html, "max logprob")[2] == fmt(float(np.median([t["max_logprob"] for t in trees])))
    top = summary["uncertainty"]["top"]
    assert f"{len(top['samples'])} samples, most leaves first" in html
    assert all(s["leaves"] >= top["leaves_threshold"] for s in top["samples"])

    # Goals: every scored conversation is in exactly one cluster.
    clusters = json.loads((out / "clusters.json").read_text(encoding="utf-8"))
    assert sum(c["size"] for c in clusters["clusters"]) == 50 and set(clusters["assignments"]) == set(ids)

    # The report in a real browser, offline: no console error, the drawn trees have their leaves.
    loaded = open_page((out / "report.html").as_uri(), tmp_path / "report.png", height=3000)
    assert loaded.console == [], loaded.console
    assert png_size(loaded.screenshot) == (1280, 3000)
    drawn = re.findall(r'<svg[^>]*class="rtree"[^>]*data-leaves="(\d+)"', loaded.dom)
    expected = [s["leaves"] for s in top["samples"][:3]]
    assert [int(n) for n in drawn] == expected
    for svg, n in zip(re.findall(r'<svg[^>]*class="rtree".*?</svg>', loaded.dom, re.S), expected, strict=True):
        assert svg.count('<circle class="leaf"') == n


@pytest.mark.slow
def test_eval_trees_at_every_turn_beside_the_judge(vllm_server: VllmServer, tmp_path: Path) -> None:
    """Trees at every user message, and the LLM judge's row (the tiny model judges nonsense: its
    malformed answers count as undecided, which is the point of that column)."""
    data = tmp_path / "data.jsonl"
    subset(data)
    out = tmp_path / "all"
    argv = [
        "eval",
        str(data),
        "--out",
        str(out),
        "--config",
        str(config(tmp_path / "c.yaml", vllm_server)),
        "--tree-turns",
        "all",
        "--limit",
        "3",
        "--goals",
        "off",
        "--judge",
    ]
    assert main(argv) == 0
    rows = rows_of(out)
    for r in rows:
        assert [t["turn"] for t in r["trees"]] == list(range(1, r["turns"] + 1))
        assert r["judge"]["full"]["calls"] == 2
    html = (out / "report.html").read_text(encoding="utf-8")
    assert "Not clustered: --goals off." in html and '<h3 id="judge">' in html
    judge = json.loads((out / "summary.json").read_text(encoding="utf-8"))["judge"]
    assert [r["method"] for r in judge] == ["sidecar completion (judge-free)", "two-dimensional LLM judge"]
    n = sum(1 + (r["completion"]["truncated"] is not None) for r in rows)
    undecided = sum(not r["judge"][k]["decided"] for r in rows for k in ("full", "truncated") if r["judge"][k])
    assert judge[1]["n"] == n and judge[1]["undecided"] == undecided and judge[1]["calls_per_conversation"] == 2.0
    assert cells(html, "two-dimensional LLM judge")[6] == str(undecided)
