"""Token buckets and round-robin turns: the pure pieces of a tenant's create rate and its fair share."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from corral.core.fair import RoundRobin
from corral.core.rates import Buckets, Rate, TokenBucket


def test_a_bucket_pays_its_burst_then_refuses_with_when_it_could_pay() -> None:
    b = TokenBucket(Rate(2.0, 3), now=0.0)
    assert [b.take(0.0) for _ in range(3)] == [None, None, None]
    refused = b.take(0.0)
    assert refused is not None and refused.retry_after_s == pytest.approx(0.5)
    assert b.take(0.25) is not None  # half a token is not a token
    assert b.take(0.5) is None  # exactly when it said
    assert b.take(100.0, cost=3) is None and b.tokens(100.0) == 0  # refills to its burst, not beyond


def test_a_refusal_takes_nothing_and_a_clock_step_back_adds_nothing() -> None:
    b = TokenBucket(Rate(1.0, 2), now=10.0)
    assert b.take(10.0, cost=2) is None
    for _ in range(5):
        assert b.take(10.0) is not None
    assert b.tokens(5.0) == 0  # backwards: no tokens made up
    assert b.take(11.0) is None


def test_more_than_a_burst_can_never_be_paid() -> None:
    refused = TokenBucket(Rate(5.0, 4), now=0.0).take(0.0, cost=5)
    assert refused is not None and refused.retry_after_s == math.inf
    with pytest.raises(ValueError):
        TokenBucket(Rate(5.0, 4), now=0.0).take(0.0, cost=0)


@pytest.mark.parametrize(("rate", "burst"), [(0.0, 1), (-1.0, 1), (math.inf, 1), (math.nan, 1), (1.0, 0)])
def test_a_rate_that_means_nothing_is_refused(rate: float, burst: int) -> None:
    with pytest.raises(ValueError):
        Rate(rate, burst)


def test_a_share_divides_the_rate_and_keeps_at_least_one_request() -> None:
    assert Rate(10.0, 20).share(4) == Rate(2.5, 5)
    assert Rate(1.0, 2).share(3) == Rate(1.0 / 3, 1)
    assert Rate(1.0, 2).share(0) == Rate(1.0, 2)


def test_retuning_keeps_the_tokens_held_up_to_the_new_burst() -> None:
    b = TokenBucket(Rate(1.0, 10), now=0.0)
    b.retune(Rate(1.0, 3), now=0.0)
    assert b.tokens(0.0) == 3
    b.retune(Rate(100.0, 100), now=0.0)
    assert b.tokens(0.0) == 3 and b.tokens(0.5) == 53


@given(
    st.floats(0.1, 100),
    st.integers(1, 50),
    st.lists(st.tuples(st.floats(0, 0.5), st.integers(1, 5)), max_size=200),
)
def test_what_a_bucket_pays_never_exceeds_its_burst_plus_its_rate_over_time(
    rate: float, burst: int, asks: list[tuple[float, int]]
) -> None:
    b, now, paid = TokenBucket(Rate(rate, burst), now=0.0), 0.0, 0
    for gap, cost in asks:
        now += gap
        refused = b.take(now, cost)
        if refused is None:
            paid += cost
        else:
            assert refused.retry_after_s > 0
            if cost <= burst:  # waiting what it said pays it
                assert b.tokens(now) + refused.retry_after_s * rate >= cost - 1e-9
        assert paid <= burst + rate * now + 1e-6


def test_the_table_forgets_full_buckets_first_and_stays_bounded() -> None:
    table = Buckets(max_keys=3)
    r = Rate(1.0, 2)
    assert table.take("a", r, 0.0, cost=2) is None  # drained
    assert table.take("b", r, 0.0) is None
    assert table.take("c", r, 0.0) is None
    assert table.take("d", r, 10.0) is None  # every bucket refilled by now: all dropped, d alone
    assert len(table) == 1
    assert table.take("a", r, 10.0, cost=2) is None and table.take("a", r, 10.0) is not None  # a starts full
    for key in "xyz":
        table.take(key, r, 10.0, cost=2)
    assert len(table) <= 3


def test_round_robin_serves_a_newcomer_after_one_turn_of_a_crowd() -> None:
    q: RoundRobin[int] = RoundRobin()
    for i in range(1000):
        q.push("a", i)
    q.push("b", -1)
    assert [q.pop() for _ in range(3)] == [("a", 0), ("b", -1), ("a", 1)]
    assert len(q) == 998 and q.waiting("b") == 0


def test_round_robin_withdraws_and_keeps_each_keys_order() -> None:
    q: RoundRobin[int] = RoundRobin()
    for key, item in [("a", 1), ("b", 2), ("a", 3), ("c", 4), ("b", 5)]:
        q.push(key, item)
    assert q.remove("b", lambda x: x == 2) and not q.remove("b", lambda x: x == 2)
    assert not q.remove("nobody", lambda x: True)
    out = []
    while (turn := q.pop()) is not None:
        out.append(turn)
    assert out == [("a", 1), ("b", 5), ("c", 4), ("a", 3)]
    assert q.pop() is None and len(q) == 0


@given(st.lists(st.sampled_from("abcd"), max_size=100))
def test_no_key_waits_more_than_one_turn_of_each_other_key(keys: list[str]) -> None:
    q: RoundRobin[int] = RoundRobin()
    for i, k in enumerate(keys):
        q.push(k, i)
    served: list[str] = []
    while (turn := q.pop()) is not None:
        served.append(turn[0])
    assert sorted(served) == sorted(keys)
    # Between two turns of one key, no other key is served twice while the first still waits.
    for k in set(keys):
        spots = [i for i, s in enumerate(served) if s == k]
        for a, b in itertools.pairwise(spots):
            between = served[a + 1 : b]
            assert all(between.count(o) <= 1 for o in set(between))


def test_work_already_done_is_paid_in_debt_that_time_repays() -> None:
    bucket = TokenBucket(Rate(10, 5), now=0.0)
    bucket.spend(0.0, 8)  # two readers at once read past the five held
    assert bucket.tokens(0.0) == -3
    assert bucket.take(0.0) is not None  # nothing more until the debt is repaid
    assert bucket.tokens(0.3) == pytest.approx(0.0)
    assert bucket.take(0.4) is None
    assert bucket.tokens(100.0) == 5  # repaid, then full: never past the burst
