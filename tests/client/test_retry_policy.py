"""The pure retry policy: full-jitter windows, Retry-After as a floor, deadline bookkeeping."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from corral.client import CapacityUnavailable, CorralError, RetryBudget, RetryPolicy


def test_window_doubles_then_caps() -> None:
    policy = RetryPolicy(base_s=0.25, cap_s=8.0)
    assert [policy.window(n) for n in range(7)] == [0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 8.0]
    assert policy.window(10_000) == 8.0


@given(
    retry=st.integers(min_value=0, max_value=200),
    seed=st.integers(min_value=0, max_value=2**32 - 1),
    base=st.floats(min_value=0.001, max_value=5.0),
    extra=st.floats(min_value=0.0, max_value=60.0),
)
def test_unhinted_delay_is_within_the_full_jitter_window(
    retry: int, seed: int, base: float, extra: float
) -> None:
    policy = RetryPolicy(base_s=base, cap_s=base + extra)
    delay = policy.delay(retry, None, random.Random(seed))
    assert 0.0 <= delay <= policy.window(retry)


@given(
    retry=st.integers(min_value=0, max_value=20),
    hint=st.floats(min_value=0.0, max_value=120.0),
    seed=st.integers(min_value=0, max_value=2**32 - 1),
)
def test_retry_after_is_a_floor_with_jitter_above_it(retry: int, hint: float, seed: int) -> None:
    policy = RetryPolicy()
    delay = policy.delay(retry, hint, random.Random(seed))
    assert hint <= delay <= hint + policy.window(retry)


def test_jitter_spreads_a_wave() -> None:
    # Fifty clients refused in the same instant must not come back in the same instant.
    rng = random.Random(1)
    delays = [RetryPolicy().delay(2, 1.0, rng) for _ in range(50)]
    assert len({round(d, 6) for d in delays}) == 50
    assert max(delays) - min(delays) > 0.5


@pytest.mark.parametrize(
    "kwargs",
    [{"base_s": -1.0}, {"cap_s": float("inf")}, {"deadline_s": float("nan")}, {"base_s": 2.0, "cap_s": 1.0}],
)
def test_nonsense_policies_are_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        RetryPolicy(**kwargs)


def test_budget_clamps_to_the_deadline_then_gives_up() -> None:
    now = [0.0]
    budget = RetryBudget(RetryPolicy(base_s=1.0, cap_s=1.0, deadline_s=2.5), lambda: now[0], random.Random(3))
    refused = CorralError("full", code="no_capacity", status=503, retry_after_s=3.0)

    budget.attempt()
    delay = budget.after_refusal(refused)
    assert delay == 2.5  # the hint (3 s + jitter) is clamped to what is left: the last try is at the deadline
    now[0] += delay
    budget.attempt()
    with pytest.raises(CapacityUnavailable) as info:
        budget.after_refusal(refused)
    err = info.value
    assert err.code == "no_capacity"
    assert err.attempts == 2
    assert err.elapsed_s == 2.5
    assert err.first_refusal_at == 0.0
    assert err.refusals == {"no_capacity": 2}
    assert err.retry_after_s == 3.0
    assert err.__cause__ is refused


def test_stats_measure_time_from_first_refusal_to_success() -> None:
    now = [10.0]
    budget = RetryBudget(RetryPolicy(), lambda: now[0], random.Random(0))
    budget.attempt()
    now[0] += 0.5  # the first attempt took half a second to be refused
    delay = budget.after_refusal(CorralError("x", code="store_unavailable", status=503))
    now[0] += delay
    budget.attempt()
    stats = budget.stats()
    assert stats.attempts == 2
    assert stats.refusals == {"store_unavailable": 1}
    assert stats.refusal_to_success_s == pytest.approx(delay)
    assert stats.elapsed_s == pytest.approx(0.5 + delay)
