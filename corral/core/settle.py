"""When a sandbox's measured memory may replace its reserve under working-set admission.

Two conditions, both required. The sandbox is older than its runtime's settle time: how long after a
start a reading may still understate memory for reasons the sandbox did not choose (a guest kernel
faulting its working set in over seconds). And the reading has stopped moving: it is within a small
tolerance of the reading before it, so a sandbox still ramping keeps its reserve however old it is.
A runtime whose readings are exact from the first page (a process in its own memory cgroup) declares a
settle time of zero, and its sandboxes are trusted as soon as two readings agree.
"""

from __future__ import annotations

from dataclasses import dataclass

# A guest ramps its working set over ~5 s (the touch model): twice that before a reading counts.
DEFAULT_SETTLE_S = 10.0


@dataclass(frozen=True, slots=True)
class SettleRule:
    settle_s: float = DEFAULT_SETTLE_S
    tolerance_mb: int = 2
    tolerance_frac: float = 0.05

    def __post_init__(self) -> None:
        if self.settle_s < 0:
            raise ValueError("settle_s must not be negative")

    def trusted(self, age_s: float, reading_mb: int, previous_mb: int | None) -> bool:
        """Whether ``reading_mb``, taken at ``age_s``, may replace the reserve (``previous_mb``: the
        reading before it, None if this is the first)."""
        if age_s < self.settle_s or previous_mb is None:
            return False
        allowed = max(self.tolerance_mb, self.tolerance_frac * max(reading_mb, previous_mb))
        return abs(reading_mb - previous_mb) <= allowed
