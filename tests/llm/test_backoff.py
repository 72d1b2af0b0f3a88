"""The one jitter policy: bounds of every delay, for the bounded LLM retry and ``until_accepted``."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sidecar.retry import Backoff, backoff_delay


@given(
    attempt=st.integers(min_value=-5, max_value=10_000),
    initial=st.floats(min_value=1e-6, max_value=100.0),
    cap=st.floats(min_value=1e-6, max_value=1000.0),
)
def test_no_delay_is_above_the_cap_or_below_half_the_first_one(attempt: int, initial: float, cap: float) -> None:
    d = backoff_delay(attempt, initial, cap)
    assert min(cap, initial) / 2 <= d <= cap


@given(attempt=st.integers(min_value=1, max_value=30), initial=st.floats(min_value=1e-3, max_value=10.0))
def test_each_delay_is_within_half_and_all_of_its_nominal_value(attempt: int, initial: float) -> None:
    nominal = min(60.0, initial * 2 ** (attempt - 1))
    assert nominal / 2 <= backoff_delay(attempt, initial, 60.0) <= nominal


def test_delays_double_from_the_initial_one_up_to_the_cap_and_are_jittered() -> None:
    for attempt, nominal in [(1, 0.2), (2, 0.4), (3, 0.8), (4, 1.6), (5, 3.2), (6, 5.0), (40, 5.0)]:
        samples = [backoff_delay(attempt, 0.2, 5.0) for _ in range(200)]
        assert min(samples) >= nominal / 2 and max(samples) <= nominal
        assert max(samples) - min(samples) > nominal / 2 * 0.8  # spread over most of [d/2, d]


def test_backoff_yields_the_same_policy_and_resets() -> None:
    b = Backoff(0.1, 0.4)
    delays = [b.delay() for _ in range(5)]
    for d, nominal in zip(delays, [0.1, 0.2, 0.4, 0.4, 0.4], strict=True):
        assert nominal / 2 <= d <= nominal
    b.reset()
    assert 0.05 <= b.delay() <= 0.1


@pytest.mark.parametrize(("initial", "cap"), [(0.0, 1.0), (-1.0, 1.0), (2.0, 1.0)])
def test_backoff_refuses_impossible_bounds(initial: float, cap: float) -> None:
    with pytest.raises(ValueError, match="backoff needs"):
        Backoff(initial, cap)
