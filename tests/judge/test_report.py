"""The comparison table: figures computed by hand, judge-free rows read from the committed
``adapters eval`` report, Markdown and JSON forms."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sidecar.tools.judge.report import (
    MethodRow,
    classification_row,
    comparison_json,
    comparison_markdown,
    rows_from_eval_section,
)

REPORT = Path(__file__).resolve().parents[2] / "adapters" / "reports" / "report.json"


def test_classification_row_by_hand() -> None:
    # 6 examples: labels C C C I I I; predictions C C I C I I -> tp 2, fn 1, fp 1, tn 2.
    labels = [True, True, True, False, False, False]
    preds = [True, True, False, True, False, False]
    row = classification_row("judge", labels, preds, judge_free=False, undecided=1, calls=12, prompt_tokens=3000,
                             completion_tokens=600)  # fmt: skip
    assert row.n == 6
    assert row.accuracy == pytest.approx(4 / 6)
    assert row.precision == pytest.approx(2 / 3) and row.recall == pytest.approx(2 / 3)
    assert row.f1 == pytest.approx(2 / 3)
    assert (row.calls_per_conversation, row.prompt_tokens_per_conversation) == (2.0, 500.0)
    assert row.completion_tokens_per_conversation == 100.0 and row.undecided == 1 and not row.judge_free


def test_degenerate_rows() -> None:
    never = classification_row("never complete", [True, False], [False, False])
    assert (never.accuracy, never.precision, never.recall, never.f1) == (0.5, 0.0, 0.0, 0.0)
    assert never.calls_per_conversation is None
    empty = classification_row("nothing", [], [])
    assert empty.n == 0 and empty.accuracy is None and empty.f1 is None
    with pytest.raises(ValueError, match="labels"):
        classification_row("bad", [True], [])


def test_judge_free_rows_come_from_the_adapters_report() -> None:
    section = json.loads(REPORT.read_text())["results"]["sgd"]["protocol"]
    rows = rows_from_eval_section(section)
    names = [r.method for r in rows]
    assert names[0] == "LoRA adapter + end tag (judge-free)" and len(rows) == 4
    adapter = rows[0]
    assert adapter.n == section["adapter"]["n"] and adapter.f1 == section["adapter"]["complete"]["f1"]
    assert all(r.judge_free for r in rows) and adapter.calls_per_conversation is None
    assert rows_from_eval_section({}) == []


def test_markdown_and_json_put_the_judge_beside_the_judge_free_rows() -> None:
    free = MethodRow("adapter (judge-free)", 200, 0.98, 0.971, 0.99, 0.98, calls_per_conversation=1.0,
                     prompt_tokens_per_conversation=256.0, completion_tokens_per_conversation=1.0)  # fmt: skip
    judge = classification_row("judge", [True, False], [True, True], judge_free=False, calls=4, prompt_tokens=2000,
                               completion_tokens=100)  # fmt: skip
    md = comparison_markdown([free, judge], title="sgd")
    lines = md.strip().split("\n")
    assert lines[0] == "### sgd"
    assert lines[2].startswith("| method | judge-free | n | acc |") and lines[2].endswith("| gen tok/conv |")
    assert lines[4] == "| adapter (judge-free) | yes | 200 | 0.980 | 0.971 | 0.990 | 0.980 | 0 | 1.00 | 256.0 | 1.0 |"
    assert lines[5] == "| judge | no | 2 | 0.500 | 0.500 | 1.000 | 0.667 | 0 | 2.00 | 1000.0 | 50.0 |"
    doc = comparison_json([free, judge])
    assert json.loads(json.dumps(doc)) == doc
    assert doc[1]["method"] == "judge" and doc[1]["calls_per_conversation"] == 2.0
    assert "| — |" in comparison_markdown([MethodRow("x", 0, None, None, None, None)])
