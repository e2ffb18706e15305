"""A sandbox's memory readings over time: one per interval, bounded, read back by range."""

from __future__ import annotations

import pytest

from corral.core.samples import Sample, SampleLog


def test_one_reading_per_interval_the_earliest_kept() -> None:
    log = SampleLog(interval_s=5, keep=10)
    kept = [log.add(t, mb) for t, mb in ((100.0, 10), (102.0, 20), (105.0, 30), (109.9, 40), (110.0, 50))]
    assert kept == [True, False, True, False, True]
    assert log.between(0, 1e12) == [Sample(100.0, 10), Sample(105.0, 30), Sample(110.0, 50)]
    assert not log.add(90.0, 1)  # a clock stepped back adds nothing out of order
    assert log.due(115.0) and not log.due(114.0)


def test_a_range_includes_both_ends_and_may_be_empty() -> None:
    log = SampleLog(interval_s=1, keep=100)
    for t in range(10):
        log.add(float(t), t)
    assert [s.at for s in log.between(3, 6)] == [3.0, 4.0, 5.0, 6.0]
    assert [s.at for s in log.between(2.5, 3.5)] == [3.0]
    assert log.between(20, 30) == [] and log.between(6, 3) == []


def test_the_oldest_go_first_past_the_bound() -> None:
    log = SampleLog(interval_s=1, keep=3)
    for t in range(6):
        log.add(float(t), t * 10)
    assert len(log) == 3
    assert log.between(0, 100) == [Sample(3.0, 30), Sample(4.0, 40), Sample(5.0, 50)]


def test_bad_bounds_are_refused() -> None:
    with pytest.raises(ValueError):
        SampleLog(interval_s=0)
    with pytest.raises(ValueError):
        SampleLog(keep=0)
