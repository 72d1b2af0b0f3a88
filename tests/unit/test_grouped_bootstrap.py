"""The one bootstrap over conversations: whole groups are drawn, degenerate rounds left out."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sidecar.tools.classification import grouped_bootstrap


def test_rows_of_a_group_are_always_drawn_together() -> None:
    groups = ["a", "a", "b", "c", "c", "c"]
    seen: list[list[int]] = []

    def record(pick: npt.NDArray[np.intp]) -> float:
        seen.append(sorted(pick.tolist()))
        return 0.0

    grouped_bootstrap(groups, record, rounds=200, seed=1)
    whole = {"a": [0, 1], "b": [2], "c": [3, 4, 5]}
    for pick in seen:
        for rows in whole.values():
            counts = {pick.count(r) for r in rows}
            assert len(counts) == 1  # each row of a group as often as its siblings
        # as many groups drawn as there are: the draw's size is a sum of three group sizes
        sizes = {g: len(r) for g, r in whole.items()}
        drawn = {g: pick.count(rows[0]) for g, rows in whole.items()}
        assert sum(drawn.values()) == 3
        assert len(pick) == sum(sizes[g] * n for g, n in drawn.items())


def test_rounds_answered_none_are_left_out_and_one_seed_draws_the_same_rounds() -> None:
    groups = [f"c{i}" for i in range(4)]
    labels = np.array([True, False, True, False])

    def mixed(pick: npt.NDArray[np.intp]) -> float | None:
        return None if labels[pick].all() or not labels[pick].any() else float(labels[pick].mean())

    values = grouped_bootstrap(groups, mixed, rounds=500, seed=7)
    assert 0 < len(values) < 500  # four conversations: some draws hold one class only
    assert all(0.0 < v < 1.0 for v in values)
    assert grouped_bootstrap(groups, mixed, rounds=500, seed=7) == values
    assert grouped_bootstrap(groups, mixed, rounds=500, seed=8) != values


def test_the_interval_narrows_as_conversations_are_added() -> None:
    rng = np.random.default_rng(0)

    def width(n: int) -> float:
        x = rng.normal(size=n)
        values = grouped_bootstrap([str(i) for i in range(n)], lambda pick: float(x[pick].mean()), 1000)
        lo, hi = np.percentile(values, [2.5, 97.5])
        return float(hi - lo)

    assert width(400) < width(25) / 2  # about 1/sqrt(n): 4 times narrower


def test_no_groups_is_no_sample_and_rounds_must_be_positive() -> None:
    assert grouped_bootstrap([], lambda pick: 1.0, rounds=10) == []
    with pytest.raises(ValueError, match="rounds"):
        grouped_bootstrap(["a"], lambda pick: 1.0, rounds=0)


@given(st.lists(st.sampled_from("abcdefgh"), min_size=1, max_size=40), st.integers(0, 2**32 - 1))
def test_every_draw_indexes_real_rows(groups: list[str], seed: int) -> None:
    def check(pick: npt.NDArray[np.intp]) -> float:
        assert pick.min() >= 0 and pick.max() < len(groups)
        return float(len(pick))

    sizes = grouped_bootstrap(groups, check, rounds=5, seed=seed)
    assert len(sizes) == 5 and all(s >= 1 for s in sizes)
