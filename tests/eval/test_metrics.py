"""The report's numbers from rows: checked against scikit-learn and hand-computed cases."""

from __future__ import annotations

import math
import random
from typing import Any

import numpy as np
import pytest
from sklearn.metrics import accuracy_score, precision_recall_fscore_support, roc_auc_score

from sidecar.tools.eval.metrics import completion_section, correlation, top_on_both, uncertainty_section
from sidecar.tools.eval.report import fmt
from sidecar.tools.eval.run import through_user_message, truncation_turn
from sidecar.transcript.model import Message


def row(
    i: int,
    source: str,
    full: tuple[float, bool] | None,
    trunc: tuple[float, bool] | None,
    tree: tuple[int, float, int] | None = None,
    **labels: Any,
) -> dict[str, Any]:
    comp: dict[str, Any] = {
        "full": {"p_end": full[0], "complete": full[1]} if full else {"error": "prompt_too_long"},
        "truncated": {"turn": 1, "p_end": trunc[0], "complete": trunc[1]} if trunc else None,
    }
    trees = (
        []
        if tree is None
        else [
            {
                "turn": 2,
                "leaves": tree[0],
                "max_logprob": tree[1],
                "length_chars": tree[2],
                "best_branch": "b",
                "branches": [],
            }
        ]
    )
    return {"id": f"c{i}", "source": source, "labels": labels, "completion": comp, "trees": trees}


def test_completion_metrics_match_sklearn_for_both_classes() -> None:
    rng = random.Random(3)
    rows = []
    for i in range(80):
        pf, pt = rng.random(), rng.random() * 0.7
        rows.append(row(i, "a" if i % 2 else "b", (pf, pf > 0.4), (pt, pt > 0.5) if i % 5 else None))
    rows.append(row(99, "a", None, None))
    s = completion_section(rows)
    ys = [True] * 80 + [False] * sum(1 for i in range(80) if i % 5)
    preds = [r["completion"]["full"]["complete"] for r in rows[:80]] + [
        r["completion"]["truncated"]["complete"] for r in rows[:80] if r["completion"]["truncated"]
    ]
    scores = [r["completion"]["full"]["p_end"] for r in rows[:80]] + [
        r["completion"]["truncated"]["p_end"] for r in rows[:80] if r["completion"]["truncated"]
    ]
    o = s["overall"]
    assert o["n"] == len(ys) and s["errors"] == 1
    assert math.isclose(o["accuracy"], accuracy_score(ys, preds))
    p, r, f, _ = precision_recall_fscore_support(ys, preds, labels=[True, False], zero_division=0)
    assert math.isclose(o["positive_complete"]["f1"], f[0]) and math.isclose(o["positive_incomplete"]["f1"], f[1])
    assert math.isclose(o["positive_complete"]["precision"], p[0])
    assert math.isclose(o["positive_incomplete"]["recall"], r[1])
    assert math.isclose(o["roc_auc"], roc_auc_score(ys, scores))
    assert set(s["by_source"]) == {"a", "b"} and s["real_labels"] is None


def test_real_labels_row_only_with_both_classes() -> None:
    rows = [row(i, "star", (0.9 if i % 3 else 0.1, bool(i % 3)), None, completed=bool(i % 4)) for i in range(12)]
    s = completion_section(rows)
    assert s["real_labels"] is not None and s["real_labels"]["n"] == 12
    assert completion_section([row(0, "star", (0.9, True), None, completed=True)])["real_labels"] is None


def test_correlations_pearson_spearman_and_degenerate() -> None:
    a = [1.0, 2.0, 3.0, 4.0, 5.0]
    c = correlation(a, [x**3 for x in a])
    assert c["spearman"] == pytest.approx(1.0)
    assert c["pearson"] == pytest.approx(np.corrcoef(a, [x**3 for x in a])[0, 1])
    assert correlation([1, 1, 1, 1], [1, 2, 3, 4])["pearson"] is None  # constant: undefined, not NaN
    assert correlation([1, 2], [2, 1])["spearman"] is None
    tied = correlation([1, 1, 2, 2, 3], [1, 2, 3, 4, 5])
    assert tied["spearman"] == pytest.approx(0.9486832980505138)  # average ranks for ties


def test_top_ten_percent_on_both() -> None:
    trees = [
        {"id": f"c{i}", "turn": 1, "leaves": i % 10 + 1, "max_logprob": -float(i % 7), "source": "s"}
        for i in range(100)
    ]
    top = top_on_both(trees)
    assert top["leaves_threshold"] == pytest.approx(float(np.percentile([t["leaves"] for t in trees], 90)))
    assert all(
        t["leaves"] >= top["leaves_threshold"] and t["max_logprob"] <= top["max_logprob_threshold"]
        for t in top["samples"]
    )
    outside = [t for t in trees if t not in top["samples"]]
    assert not any(
        t["leaves"] >= top["leaves_threshold"] and t["max_logprob"] <= top["max_logprob_threshold"] for t in outside
    )
    assert top_on_both([])["samples"] == []


def test_uncertainty_section_skips_failed_trees() -> None:
    rows = [row(i, "s", (0.5, True), None, (i + 1, -float(i), 100 * i)) for i in range(10)]
    rows[0]["trees"] = [{"turn": 1, "error": "prompt_too_long"}]
    u = uncertainty_section(rows)
    assert u["trees"] == 9 and u["errors"] == 1
    assert u["leaves"]["mean"] == pytest.approx(np.mean(range(2, 11)))
    assert u["correlations"]["all"]["max logprob vs leaves"]["spearman"] == pytest.approx(-1.0)


def test_truncation_turn_is_stable_and_in_range() -> None:
    assert truncation_turn("x", 1, 0) is None
    ks = [truncation_turn(f"c{i}", 6, 0) for i in range(300)]
    assert set(ks) == {1, 2, 3, 4, 5}
    assert ks == [truncation_turn(f"c{i}", 6, 0) for i in range(300)]
    assert ks != [truncation_turn(f"c{i}", 6, 1) for i in range(300)]


def test_tree_prompt_context_ends_at_the_user_message() -> None:
    msgs = [
        Message("system", "s"),
        Message("user", "a"),
        Message("assistant", "b"),
        Message("user", "c"),
        Message("assistant", "d"),
    ]
    assert [m.content for m in through_user_message(msgs, 1)] == ["s", "a"]
    assert [m.content for m in through_user_message(msgs, 2)] == ["s", "a", "b", "c"]


def test_number_format() -> None:
    assert fmt(0.12345) == "0.123" and fmt(-0.0001) == "0.000" and fmt(-1.5) == "-1.500"
    assert fmt(None) == "—" and fmt(True) == "yes" and fmt(3) == "3" and fmt("<b>") == "&lt;b&gt;"
