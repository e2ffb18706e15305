"""The starts limiter, a per-host circuit breaker against a herd of starts: at most ``limit`` starts in flight; a start that cannot get a
slot within ``wait_s`` is refused, fast and retryably.

It is a circuit breaker, not a queue: queueing here would only move the pile-up from the host's CPU to
the caller's timeout budget, and the caller cannot tell slow from stuck.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager


class StartsSaturated(Exception):
    """No start slot became free in time."""


class StartsLimiter:
    def __init__(self, limit: int = 8, wait_s: float = 0.15) -> None:
        if limit < 1:
            raise ValueError("max_concurrent_starts must be >= 1")
        if wait_s < 0:
            raise ValueError("wait_s must not be negative")
        self.limit = limit
        self.wait_s = wait_s
        self._in_flight = 0
        # Slots are handed over directly to the oldest waiter, so a release can never be lost to a
        # waiter that timed out at the same instant.
        self._waiters: deque[asyncio.Future[None]] = deque()
        self.refused_total = 0

    @property
    def in_flight(self) -> int:
        return self._in_flight

    @property
    def saturated(self) -> bool:
        """True when an acquire would have to wait."""
        return self._in_flight >= self.limit or bool(self._waiters)

    async def acquire(self) -> None:
        if not self.saturated:
            self._in_flight += 1
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        try:
            async with asyncio.timeout(self.wait_s):
                await asyncio.shield(fut)
        except TimeoutError:
            if self._forfeit(fut):
                return  # the slot arrived as the timer fired: it is ours after all
            self.refused_total += 1
            raise StartsSaturated(f"{self._in_flight} starts in flight (limit {self.limit})") from None
        except BaseException:
            if self._forfeit(fut):
                self.release()  # cancelled after a slot was handed to us: pass it on
            raise

    def _forfeit(self, fut: asyncio.Future[None]) -> bool:
        """Withdraw a waiter; True if a slot had already been handed to it."""
        if fut.done():
            return True
        fut.cancel()
        self._waiters.remove(fut)
        return False

    def release(self) -> None:
        if self._in_flight <= 0:
            raise RuntimeError("release() without a matching acquire()")
        while self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_result(None)  # the slot changes hands; in_flight stays the same
                return
        self._in_flight -= 1

    @asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        await self.acquire()
        try:
            yield
        finally:
            self.release()
