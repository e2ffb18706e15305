"""At most ``limit`` creates worked on at once by this replica; the rest wait, tenant by tenant.

A free slot goes to the next tenant in turn (:class:`corral.core.fair.RoundRobin`), each tenant's own
creates in the order they came: a tenant with a thousand creates waiting delays another tenant's first
by one turn. A slot is handed over directly to its next holder, so a release is never lost to a waiter
cancelled at the same instant, and a holder about to wait for something long (a parked create's
placement) gives its slot back first (:meth:`CreateTurn.release`).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from corral.core.fair import RoundRobin


class CreateTurn:
    """One held slot; :meth:`release` gives it back (once; the gate's context does it otherwise)."""

    __slots__ = ("_gate", "held")

    def __init__(self, gate: FairGate) -> None:
        self._gate = gate
        self.held = True

    def release(self) -> None:
        if self.held:
            self.held = False
            self._gate._release()


class FairGate:
    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError("the gate's limit must be >= 1")
        self.limit = limit
        self._held = 0
        self._waiting: RoundRobin[asyncio.Future[None]] = RoundRobin()

    @property
    def in_flight(self) -> int:
        return self._held

    def waiting(self, key: str | None = None) -> int:
        return len(self._waiting) if key is None else self._waiting.waiting(key)

    @asynccontextmanager
    async def slot(self, key: str) -> AsyncIterator[CreateTurn]:
        await self._acquire(key)
        held = CreateTurn(self)
        try:
            yield held
        finally:
            held.release()

    async def _acquire(self, key: str) -> None:
        if self._held < self.limit and not len(self._waiting):
            self._held += 1
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.push(key, fut)
        try:
            await fut
        except BaseException:
            if fut.done() and not fut.cancelled():
                self._release()  # handed a slot as it was cancelled: pass it on
            else:
                self._waiting.remove(key, lambda f: f is fut)
            raise

    def _release(self) -> None:
        while (turn := self._waiting.pop()) is not None:
            fut = turn[1]
            if not fut.done():
                fut.set_result(None)  # the slot changes hands; the count stays the same
                return
        self._held -= 1
