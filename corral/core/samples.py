"""A sandbox's memory readings over its life, kept for E2B's ``get_metrics`` over a time range.

The agent reads each sandbox's memory at its heartbeats (and when asked for metrics); this keeps at most
one reading per ``interval_s`` (E2B samples every 5 s), the earliest of each, and at most ``keep`` of
them, the oldest dropped first, so a sandbox's history costs a bounded few kilobytes however long it
runs. Stored as two flat arrays (8 and 4 bytes a reading), not one object per reading.
"""

from __future__ import annotations

import bisect
from array import array
from dataclasses import dataclass

SAMPLE_INTERVAL_S = 5.0  # E2B's own sampling interval
SAMPLES_KEPT = 720  # an hour of them


@dataclass(frozen=True, slots=True)
class Sample:
    at: float  # unix seconds
    memory_mb: int


class SampleLog:
    def __init__(self, interval_s: float = SAMPLE_INTERVAL_S, keep: int = SAMPLES_KEPT) -> None:
        if interval_s <= 0 or keep < 1:
            raise ValueError("interval_s must be positive and keep at least 1")
        self.interval_s, self.keep = interval_s, keep
        self._at = array("d")
        self._mb = array("I")

    def __len__(self) -> int:
        return len(self._at)

    def due(self, now: float) -> bool:
        """Whether a reading taken ``now`` would be kept (none kept within the interval before it)."""
        return not self._at or now - self._at[-1] >= self.interval_s

    def add(self, at: float, memory_mb: int) -> bool:
        """Keep the reading unless one was kept less than an interval before it (or it goes back in
        time: a clock stepped backwards); returns whether it was kept."""
        if not self.due(at):
            return False
        self._at.append(at)
        self._mb.append(max(0, memory_mb))
        if len(self._at) > self.keep:
            del self._at[0]
            del self._mb[0]
        return True

    def between(self, start: float, end: float) -> list[Sample]:
        """The readings kept from ``start`` to ``end``, both included, oldest first."""
        lo = bisect.bisect_left(self._at, start)
        hi = bisect.bisect_right(self._at, end)
        return [Sample(self._at[i], self._mb[i]) for i in range(lo, hi)]
