"""The real clock, kept at the edge: the pure core takes a ``Clock`` as an argument and never reads the
time itself."""

from __future__ import annotations

import time


class SystemClock:
    """Wall-clock seconds since the epoch (``time.time()``), not a monotonic clock.

    Heartbeats, leases and reservation expiries are written by one process and compared by another (an
    agent, another replica), and only wall time means the same instant on both. The price: a step of
    the host's clock (an NTP correction) moves every reading, so a deadline may come early or late by
    that step."""

    __slots__ = ()

    def now(self) -> float:
        return time.time()
