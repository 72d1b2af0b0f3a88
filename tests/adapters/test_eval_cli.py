"""``adapters eval`` end to end: the committed base and completion adapter on a vLLM server it starts,
a few real conversations (the demo sample's STAR ones), the report it writes."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from adapters.cli import main
from sidecar.tools.demo.models import scoring_unavailable_reason

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "adapters" / "artifacts"
SAMPLE = REPO / "sidecar" / "tools" / "demo" / "data" / "sample.jsonl.gz"


def _prepared(root: Path) -> Path:
    """``prepare``'s layout from the sample: 16 STAR conversations on the train side, 4 on the test
    side (each whole, labelled complete, and cut after its first agent reply, incomplete)."""
    with gzip.open(SAMPLE, "rt", encoding="utf-8") as fh:
        star = [r for r in map(json.loads, fh) if r["source"] == "star" and len(r["turns"]) >= 6][:20]
    d = root / "star"
    d.mkdir(parents=True)
    with (d / "train.jsonl").open("w") as fh:
        for r in star[:16]:
            fh.write(json.dumps({"conversation_id": r["conversation_id"], "messages": r["turns"]}) + "\n")
    with (d / "test.jsonl").open("w") as fh:
        for r in star[16:]:
            first_reply = next(i for i, t in enumerate(r["turns"]) if t["role"] == "assistant" and t["content"])
            for complete, turns in ((True, r["turns"]), (False, r["turns"][: first_reply + 1])):
                rec: dict[str, Any] = {"conversation_id": r["conversation_id"], "complete": complete}
                fh.write(json.dumps({**rec, "messages": turns, "label_source": "truncation protocol"}) + "\n")
    (root / "manifest.json").write_text("{}\n")
    return root


@pytest.mark.vllm
def test_eval_scores_through_vllm_and_skip_base_leaves_the_base_out(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert scoring_unavailable_reason() is None
    data = _prepared(tmp_path / "data")
    out = tmp_path / "report"
    argv = ["eval", "--data", str(data), "--datasets", "star", "--base", str(ARTIFACTS / "base")]
    argv += ["--adapter", str(ARTIFACTS / "completion"), "--out", str(out), "--max-context-tokens", "256"]
    assert main([*argv, "--skip-base"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert 0.0 <= result["f1_complete"]["star"]["protocol"] <= 1.0

    report = json.loads((out / "report.json").read_text())
    protocol = report["results"]["star"]["protocol"]
    assert set(protocol) == {"label_source", "adapter", "supervised_classifier"}
    assert protocol["adapter"]["n"] == 8
    assert protocol["adapter"]["n_complete"] == 4
    assert report["meta"]["methods"] == ["adapter", "supervised_classifier"]
    assert sum(report["meta"]["p_end_methods"].values()) == 8  # every verdict read P(end) one way or another
    assert "--skip-base" in report["meta"]["command"]
    text = (out / "report.md").read_text()
    assert "| LoRA adapter + end tag (ours) |" in text
    assert "base model alone" not in text
    assert (out / "pend_hist.png").stat().st_size > 0
