"""The discrete-event loop: a heap of callbacks ordered by virtual time, driving a ``ManualClock``.

Ties are broken by insertion order, so a run is a pure function of its inputs and its seed.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from typing import Any

from corral.core import ManualClock


class EventLoop:
    def __init__(self, clock: ManualClock | None = None) -> None:
        self.clock = clock if clock is not None else ManualClock()
        self._queue: list[tuple[float, int, Callable[..., Any], tuple[Any, ...]]] = []
        self._seq = itertools.count()
        self.processed = 0

    def now(self) -> float:
        return self.clock.now()

    def at(self, when: float, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` at virtual time ``when`` (never in the past)."""
        heapq.heappush(self._queue, (max(when, self.clock.now()), next(self._seq), fn, args))

    def after(self, delay_s: float, fn: Callable[..., Any], *args: Any) -> None:
        self.at(self.clock.now() + max(0.0, delay_s), fn, *args)

    def run(self, until: float) -> None:
        """Process every event up to and including ``until``; the clock ends at ``until``."""
        queue = self._queue
        clock = self.clock
        while queue and queue[0][0] <= until:
            when, _, fn, args = heapq.heappop(queue)
            if when > clock.now():
                clock.set(when)
            fn(*args)
            self.processed += 1
        if until > clock.now():
            clock.set(until)

    def __len__(self) -> int:
        return len(self._queue)
