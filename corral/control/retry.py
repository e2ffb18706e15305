"""Retry-After, estimated from the fleet rather than a constant: when would asking again plausibly
succeed? When the earliest outstanding reservation ends, or when the next heartbeat is due to tell us
what changed, whichever comes first."""

from __future__ import annotations

import math

from corral.codes import ErrorCode
from corral.control.view import FleetSnapshot
from corral.core import Clock
from corral.core.timeouts import Timeouts


class RetryAfter:
    def __init__(self, clock: Clock, timeouts: Timeouts, min_s: float, max_s: float) -> None:
        self._clock = clock
        self._t = timeouts
        self._min = min_s
        self._max = max_s
        # Updated by whoever reads the store's reservation book (the reconciler).
        self.next_reservation_expiry: float | None = None

    def clamp(self, seconds: float) -> int:
        return int(max(self._min, min(self._max, math.ceil(seconds))))

    def estimate(self, code: str, snap: FleetSnapshot | None) -> int:
        now = self._clock.now()
        interval = self._t.heartbeat_interval_s
        if code == ErrorCode.STORE_UNAVAILABLE or snap is None or not snap.hosts:
            return self.clamp(interval)
        if code == ErrorCode.NO_HEALTHY_HOSTS:
            # Nothing fresh: the soonest a host can be back is its next heartbeat.
            return self.clamp(interval)
        newest = max(h.heartbeat_at for h in snap.hosts)
        # The next heartbeat is due within one interval of the newest one we saw.
        candidates = [interval - ((now - newest) % interval)]
        if self.next_reservation_expiry is not None and self.next_reservation_expiry > now:
            candidates.append(self.next_reservation_expiry - now)
        return self.clamp(min(candidates))
