"""The mapping from verdicts to evaluation results: names, scores, labels, explanations, stable ids."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from sidecar.contract import GoalAssigned, ScoreSkipped
from sidecar.evaluations.results import (
    COMPLETION_LABELS,
    EVALUATION_NAMES,
    MAX_EXPLANATION_CHARS,
    UNCERTAINTY_LABELS,
    evaluation_results,
    record_id,
    results_of,
)
from sidecar.events import SpanRef
from tests.evaluations.effects import SPAN, TRACE, all_kinds, completion, effect, tree


def test_each_verdict_maps_to_its_named_result() -> None:
    results = results_of(all_kinds())
    assert [(r.name, r.hook) for r in results] == [
        ("response_uncertainty", "user_message"),
        ("goal_completion", "turn_closed"),
        ("goal_completion", "conversation_ended"),
        ("user_goal", "conversation_ended"),
    ]
    unc, turn, final, goal = results
    assert unc.score is not None and math.isclose(unc.score, 1 - math.exp(-0.7))
    assert unc.label == "branching" and "3 leaves" in (unc.explanation or "")
    assert (turn.score, turn.label, turn.final) == (0.2, "incomplete", False)
    assert (final.score, final.label, final.final) == (0.9, "complete", True)
    assert (goal.score, goal.label) == (None, "g3")
    assert all(r.name in EVALUATION_NAMES for r in results)
    assert unc.label in UNCERTAINTY_LABELS and turn.label in COMPLETION_LABELS


def test_labels_of_trees() -> None:
    assert evaluation_results(effect("user_message", (tree(leaves=1, max_logprob=-0.1),)))[0].label == "confident"
    unscored = evaluation_results(effect("user_message", (tree(leaves=0, max_logprob=None),)))[0]
    assert (unscored.score, unscored.label) == (None, "unscored")


def test_remaining_tasks_only_with_include_text() -> None:
    e = effect("turn_closed", (completion(),))
    assert "deposit" not in (evaluation_results(e)[0].explanation or "")
    assert "remaining: pay the deposit" in (evaluation_results(e, include_text=True)[0].explanation or "")
    long = effect("turn_closed", (completion(remaining="x" * 10_000),))
    text = evaluation_results(long, include_text=True)[0].explanation or ""
    assert len(text) == MAX_EXPLANATION_CHARS


def test_skips_and_failures_are_not_results() -> None:
    assert evaluation_results(effect("user_message", (ScoreSkipped("tree", "sampled_out"),))) == []
    assert evaluation_results(effect("conversation_ended", ())) == []


def test_span_and_ids() -> None:
    span = SpanRef(TRACE, SPAN)
    with_span = results_of(all_kinds(span=span))
    without = results_of(all_kinds())
    assert all(r.span == span for r in with_span) and all(r.span is None for r in without)
    assert [r.record_id for r in with_span] == [r.record_id for r in without]  # a function of the key only
    ids = [r.record_id for r in with_span]
    assert len(set(ids)) == len(ids)  # the final verdict and the last turn's verdict differ
    assert ids[1] == record_id("conv-1", 1, "turn_closed", "goal_completion")
    assert all(len(i) == 32 and int(i, 16) >= 0 for i in ids)


def test_non_finite_scores_are_dropped() -> None:
    r = evaluation_results(effect("turn_closed", (completion(float("nan")),)))[0]
    assert r.score is None


@given(st.text(max_size=50), st.integers(0, 10_000), st.sampled_from(EVALUATION_NAMES))
def test_ids_are_deterministic_and_hex(cid: str, turn: int, name: str) -> None:
    a = record_id(cid, turn, "turn_closed", name)
    assert a == record_id(cid, turn, "turn_closed", name)
    assert a != record_id(cid, turn + 1, "turn_closed", name)
    assert len(a) == 32 and all(c in "0123456789abcdef" for c in a)


def test_goal_only_once_per_effect() -> None:
    e = effect("conversation_ended", (GoalAssigned("a"), GoalAssigned("b")))
    assert [r.label for r in evaluation_results(e)] == ["a"]
