"""Label-free calibration of the P(end) threshold on the truncation protocol."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from adapters.evaluation.calibrate import (
    ScoredExample,
    calibrate,
    candidate_thresholds,
    choose_threshold,
    cross_validated_predictions,
    objective_value,
)


def _pairs(p_full: list[float], p_cut: list[float], greedy: bool = False) -> list[ScoredExample]:
    out = []
    for i, (a, b) in enumerate(zip(p_full, p_cut, strict=True)):
        out += [ScoredExample(f"c{i}", True, a, greedy and a > 0.5), ScoredExample(f"c{i}", False, b, False)]
    return out


def test_separable_scores_give_a_threshold_between_the_classes_in_log_space() -> None:
    t = choose_threshold([True, True, False, False], [1e-2, 1e-1, 1e-6, 1e-5])
    assert t is not None and 1e-5 < t < 1e-2
    assert math.isclose(math.log(t), (math.log(1e-5) + math.log(1e-2)) / 2)
    assert choose_threshold([True, True], [0.1, 0.2]) is None  # one class: nothing to separate


def test_candidates_cover_below_and_above_every_score() -> None:
    cands = candidate_thresholds([0.0, 0.5, 0.5, 1.0])
    assert len(cands) == 4 and cands[0] < 1e-40 and cands[-1] > 1.0


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.floats(min_value=0, max_value=1)), min_size=2, max_size=40))
def test_the_chosen_threshold_is_at_least_as_good_as_any_candidate(data: list[tuple[bool, float]]) -> None:
    labels = [y for y, _ in data]
    scores = [p for _, p in data]
    t = choose_threshold(labels, scores)
    if all(labels) or not any(labels):
        assert t is None
        return
    assert t is not None
    best = objective_value(labels, [p >= t for p in scores], "balanced_accuracy")
    for c in candidate_thresholds(scores):
        assert best >= objective_value(labels, [p >= c for p in scores], "balanced_accuracy") - 1e-12


def test_cross_validation_keeps_a_conversations_copies_together_and_never_sees_its_fold() -> None:
    exs = _pairs([0.3 + i / 100 for i in range(10)], [0.01 * (i + 1) for i in range(10)])
    predicted = cross_validated_predictions(exs, 5, "balanced_accuracy")
    assert predicted == [e.complete for e in exs]  # separable: every fold learns a separating threshold
    assert cross_validated_predictions(exs[:2], 5, "balanced_accuracy") is None  # one conversation, one fold


def test_threshold_is_recommended_only_when_it_beats_greedy_out_of_sample() -> None:
    # The greedy rule never fires (the end tag is never the argmax) but P(end) separates the copies.
    weak = calibrate(_pairs([0.2] * 10, [0.001] * 10))
    assert weak["greedy"]["complete"]["f1"] == 0.0
    assert weak["recommended_rule"] == "threshold" and weak["validation_f1"] == 1.0
    assert weak["threshold_cross_validated"]["complete"]["f1"] == 1.0
    # The greedy rule is perfect already: no reason to move.
    strong = calibrate(_pairs([0.9] * 10, [0.01] * 10, greedy=True))
    assert strong["recommended_rule"] == "greedy" and strong["validation_f1"] == 1.0


@pytest.mark.parametrize("objective", ["balanced_accuracy", "f1"])
def test_objectives_are_bounded(objective: str) -> None:
    assert objective_value([True, False], [True, False], objective) == 1.0  # type: ignore[arg-type]
    assert objective_value([True, False], [False, True], objective) == 0.0  # type: ignore[arg-type]
