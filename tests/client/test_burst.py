"""Burst arithmetic (pure) and the burst runner against the fake API."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from corral.client import AsyncCorral
from corral.client.burst import BurstCreate, percentile, run_burst, summarize

from .fakes import FakeApi, refusal


def placed(host: str, ms: float = 100.0, **retried: int) -> BurstCreate:
    return BurstCreate(latency_s=ms / 1000, host_id=host, sandbox_id=f"sb-{host}", retried=retried)


def refused(code: str, ms: float = 5000.0) -> BurstCreate:
    return BurstCreate(latency_s=ms / 1000, error_code=code)


def test_zero_count_hosts_are_in_the_histogram_and_the_median() -> None:
    # The pile-up: 50 creates on one host of 12. Without the 11 empty hosts the median would be 50.
    outcomes = [placed("h0")] * 50
    hosts = [f"h{i}" for i in range(12)]
    s = summarize(outcomes, hosts)
    assert s.per_host["h0"] == 50
    assert len(s.per_host) == 12 and sum(1 for n in s.per_host.values() if n == 0) == 11
    assert s.max == 50
    assert s.median == 0.0
    assert s.max_to_median is None  # unbounded: most hosts got nothing
    assert s.mean == pytest.approx(50 / 12)
    assert s.max_to_mean == pytest.approx(12.0)


def test_spread_burst_numbers() -> None:
    counts = {"a": 5, "b": 4, "c": 3, "d": 4}
    outcomes = [placed(h) for h, n in counts.items() for _ in range(n)]
    s = summarize(outcomes, hosts=["a", "b", "c", "d", "e"])
    assert s.per_host == {"a": 5, "b": 4, "d": 4, "c": 3, "e": 0}  # tallest first
    assert (s.max, s.median) == (5, 4.0)
    assert s.max_to_median == pytest.approx(1.25)
    assert s.placed == 16 and s.requested == 16


def test_without_a_host_list_only_hosts_that_got_something_appear() -> None:
    s = summarize([placed("a"), placed("a"), placed("b")])
    assert s.per_host == {"a": 2, "b": 1}
    assert s.median == 1.5
    assert s.max_to_median == pytest.approx(2 / 1.5)


def test_unlisted_hosts_are_added_not_dropped() -> None:
    s = summarize([placed("new")], hosts=["a"])
    assert s.per_host == {"new": 1, "a": 0}


def test_refusals_by_reason_and_latency_of_successes_only() -> None:
    outcomes = [
        placed("a", 10, no_capacity=2),
        placed("a", 20),
        placed("b", 30, store_unavailable=1),
        refused("no_capacity"),
        refused("no_capacity"),
        refused("tenant_over_quota", 1),
    ]
    s = summarize(outcomes)
    assert s.refusals == {"no_capacity": 2, "tenant_over_quota": 1}
    assert s.retried == {"no_capacity": 2, "store_unavailable": 1}
    assert s.p50_ms == pytest.approx(20.0)
    assert s.p99_ms == pytest.approx(30.0)
    assert s.placed == 3 and s.requested == 6


def test_empty_burst() -> None:
    s = summarize([], hosts=["a", "b"])
    assert (s.max, s.median, s.max_to_median, s.p50_ms, s.p99_ms) == (0, 0.0, None, None, None)
    assert s.to_json()["per_host"] == {"a": 0, "b": 0}


@given(st.lists(st.floats(min_value=0, max_value=1e6), min_size=1, max_size=200), st.floats(0, 100))
def test_percentile_is_an_observed_value_in_order(values: list[float], q: float) -> None:
    p = percentile(values, q)
    assert p in values
    assert percentile(values, 0) == min(values)
    assert percentile(values, 100) == max(values)
    # At least q% of values are <= p.
    assert sum(1 for v in values if v <= p) >= q / 100 * len(values) - 1e-9


def test_percentile_rejects_nonsense() -> None:
    with pytest.raises(ValueError):
        percentile([1.0], 101)


async def test_run_burst_places_summarizes_and_cleans_up(aclient: AsyncCorral, api: FakeApi) -> None:
    api.create_script.append(refusal(503, "no_capacity", retry_after=0.5))
    report = await run_burst(aclient, 12, template="python", memory_mb=256)
    s = report.summary
    assert s.requested == 12 and s.placed == 12
    assert s.per_host == {"h1": 4, "h2": 4, "h3": 4}
    assert s.max_to_median == 1.0
    assert s.retried == {"no_capacity": 1}
    assert report.deleted == 12 and api.sandboxes == {}
    assert len(api.create_requests()) == 13
    assert s.p50_ms is not None and s.p99_ms is not None and s.p50_ms <= s.p99_ms


async def test_run_burst_counts_final_refusals_and_skips_forbidden_host_list(
    api: FakeApi, aclient: AsyncCorral
) -> None:
    api.hosts_status = 403
    api.create_script.extend([refusal(429, "tenant_over_quota"), refusal(429, "tenant_over_quota")])
    report = await run_burst(aclient, 5, template="python")
    s = report.summary
    assert s.refusals == {"tenant_over_quota": 2}
    assert s.placed == 3
    assert set(s.per_host) <= {"h1", "h2", "h3"}  # no host list: only hosts that got something
    assert report.deleted == 3 and api.sandboxes == {}


async def test_run_burst_reports_sandboxes_it_could_not_delete(aclient: AsyncCorral, api: FakeApi) -> None:
    api.delete_script.append(refusal(410, "sandbox_orphaned"))
    report = await run_burst(aclient, 3, template="python")
    assert report.deleted == 2
    assert report.delete_failures == {"sandbox_orphaned": 1}
    assert report.to_json()["delete_failures"] == {"sandbox_orphaned": 1}


async def test_run_burst_rejects_a_nonpositive_count(aclient: AsyncCorral) -> None:
    with pytest.raises(ValueError):
        await run_burst(aclient, 0, template="python")
