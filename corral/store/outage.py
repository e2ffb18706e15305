"""Knowing the store is down, and noticing the moment it is back.

Without this, every call made while the database is unreachable waits out a connection attempt or the
pool's wait for a free connection (seconds each) before it fails, and after the server returns the
pool may still be backing off between reconnects. Once a call has seen the server unreachable and a
probe on a fresh connection confirms it, the breaker fails every later call at once with
``StoreUnavailable``, while that probe keeps trying a few times a second; its first success closes the
breaker and hands the backend a chance to start over with fresh connections. A failure the probe does
not confirm (one connection killed, a pool briefly exhausted by load) opens nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from corral.core.clock import Clock
from corral.store.errors import StoreUnavailable

log = logging.getLogger(__name__)

PROBE_INTERVAL_S = 0.2


class Breaker:
    """Open while the store is known unreachable. One probe at a time runs ``probe`` until it
    succeeds, then ``recovered`` (the backend's chance to drop connections the outage killed)."""

    def __init__(
        self,
        probe: Callable[[], Awaitable[None]],
        recovered: Callable[[], Awaitable[None]],
        clock: Clock,
        *,
        interval_s: float = PROBE_INTERVAL_S,
    ) -> None:
        self._probe = probe
        self._recovered = recovered
        self._clock = clock
        self._interval_s = interval_s
        self._task: asyncio.Task[None] | None = None
        self.down_since: float | None = None
        self.reason = ""
        self.trips = 0
        self.recoveries = 0
        self.refused = 0

    @property
    def is_open(self) -> bool:
        return self.down_since is not None

    def check(self) -> None:
        """Raise at once while the store is known down: no call waits on a server that is gone."""
        if self.down_since is not None:
            self.refused += 1
            down_for = self._clock.now() - self.down_since
            raise StoreUnavailable(
                f"the store has been unreachable for {down_for:.1f}s ({self.reason}); probing for its return"
            )

    def suspect(self, exc: BaseException) -> None:
        """A call failed as if the server were unreachable. One probe decides: a server that answers
        it was only a dead connection or a pool briefly exhausted by load, and nothing opens; one that
        does not opens the breaker and is watched until it returns."""
        if self.down_since is not None or (self._task is not None and not self._task.done()):
            return
        self._task = asyncio.get_running_loop().create_task(self._verify(exc), name="corral-store-probe")

    async def _verify(self, exc: BaseException) -> None:
        try:
            await self._probe()
        except Exception:
            self._open(exc)
            await self._watch()

    def _open(self, exc: BaseException) -> None:
        self.down_since = self._clock.now()
        self.reason = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        self.trips += 1
        log.warning("store unreachable (%s); failing fast and probing", self.reason)

    async def _watch(self) -> None:
        while True:
            try:
                await self._probe()
            except Exception:
                await asyncio.sleep(self._interval_s)
                continue
            with contextlib.suppress(Exception):
                await self._recovered()
            self.down_since = None
            self.recoveries += 1
            log.warning("store reachable again")
            return

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
