"""How a sandbox's resident memory grows after it starts: the one touch model shared by the simulator
and the ``sim`` runtime.

Guest pages fault in lazily, so resident memory climbs from a small base toward a working set that is
usually a fraction of what the sandbox was configured with; some sandboxes spike for a while. A
profile is drawn once per sandbox from an injected RNG and then answers as a pure function of age.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class TouchProfile:
    limit_mb: int
    base_mb: int
    working_set_mb: int
    ramp_s: float
    spike_mb: int = 0
    spike_at_s: float = 0.0
    spike_for_s: float = 0.0

    def resident_mb(self, age_s: float) -> int:
        if age_s <= 0:
            return min(self.limit_mb, self.base_mb)
        grown = self.base_mb + (self.working_set_mb - self.base_mb) * (1.0 - math.exp(-age_s / self.ramp_s))
        if self.spike_mb and self.spike_at_s <= age_s < self.spike_at_s + self.spike_for_s:
            grown += self.spike_mb
        return min(self.limit_mb, int(grown))


@dataclass(frozen=True, slots=True)
class TouchModel:
    """Parameters of the population; ``profile`` draws one sandbox from it."""

    working_set_mb: int = 300
    working_set_jitter: float = 0.2  # +/- fraction, uniform
    base_mb: int = 24
    ramp_s: float = 5.0
    spike_probability: float = 0.0
    spike_mb: int = 1024
    spike_window_s: tuple[float, float] = (10.0, 60.0)
    spike_for_s: float = 20.0

    def profile(self, limit_mb: int, rng: random.Random) -> TouchProfile:
        ws = self.working_set_mb * (1.0 + rng.uniform(-self.working_set_jitter, self.working_set_jitter))
        spikes = rng.random() < self.spike_probability
        return TouchProfile(
            limit_mb=limit_mb,
            base_mb=min(self.base_mb, limit_mb),
            working_set_mb=min(limit_mb, max(self.base_mb, int(ws))),
            ramp_s=self.ramp_s,
            spike_mb=self.spike_mb if spikes else 0,
            spike_at_s=rng.uniform(*self.spike_window_s) if spikes else 0.0,
            spike_for_s=self.spike_for_s if spikes else 0.0,
        )
