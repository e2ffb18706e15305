"""An asyncio event loop on virtual time: ``loop.time()`` is a number that moves only when every task
is waiting, and then jumps straight to the next timer instead of sleeping. Real async code (timeouts,
``asyncio.sleep``, ``wait_for``) runs unchanged and a run of simulated minutes takes milliseconds. With
no I/O and every random draw seeded, a run is a pure function of its inputs.
"""

from __future__ import annotations

import asyncio
import selectors
from typing import Any


class Deadlock(RuntimeError):
    """Every task waits and no timer is due: nothing can ever happen again."""


class _VirtualSelector(selectors.SelectSelector):
    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        ready = super().select(0)  # only the loop's own wake-up pipe is ever registered
        if ready:
            return ready
        if timeout is None:
            raise Deadlock("every task waits on something no timer will bring")
        self.now += max(0.0, timeout)
        return []


class VirtualLoop(asyncio.SelectorEventLoop):
    def __init__(self, start: float = 0.0) -> None:
        self._vsel = _VirtualSelector()
        self._vsel.now = start
        super().__init__(self._vsel)
        # Timers are compared exactly: the virtual clock lands on them, never near them.
        self._clock_resolution = 1e-9

    def time(self) -> float:
        return self._vsel.now


def run_virtual(main: Any, start: float = 0.0) -> Any:
    """Run the coroutine ``main`` to completion on a fresh virtual-time loop."""
    loop = VirtualLoop(start)
    try:
        return loop.run_until_complete(main)
    finally:
        pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
        for t in pending:
            t.cancel()
        if pending:
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        loop.close()


class VirtualClock:
    """A :class:`corral.core.Clock` on the running loop's time, ``skew_s`` off (a replica whose clock is
    wrong by that much)."""

    __slots__ = ("loop", "skew_s")

    def __init__(self, loop: asyncio.AbstractEventLoop, skew_s: float = 0.0) -> None:
        self.loop = loop
        self.skew_s = skew_s

    def now(self) -> float:
        return self.loop.time() + self.skew_s
