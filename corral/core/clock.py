"""Clocks are injected, never read from a global. ``ManualClock`` is the test double, shipped here; the
real clock (``corral.clock.SystemClock``) lives outside the pure core."""

from __future__ import annotations

from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Seconds on a timeline shared by every process that compares the readings (the system clock
        is wall time, so it is not guaranteed to be monotonic)."""
        ...


class ManualClock:
    """A clock that moves only when told to."""

    __slots__ = ("_now",)

    def __init__(self, start: float = 0.0) -> None:
        self._now = start

    def now(self) -> float:
        return self._now

    def advance(self, seconds: float) -> float:
        if seconds < 0:
            raise ValueError("time does not go backwards")
        self._now += seconds
        return self._now

    def set(self, when: float) -> None:
        if when < self._now:
            raise ValueError("time does not go backwards")
        self._now = when
