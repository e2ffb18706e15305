"""Self-fencing: a host cut off from the control plane freezes its leased (recreate-policy) sandboxes
before the control plane can start them elsewhere, and stops them once it would have been declared
dead; a reply that renews the lease thaws what the reply did not tell it to stop.

The lease (:class:`corral.core.runlease.RunLease`) is counted on a monotonic clock from when the
heartbeat that earned it was sent, so neither this host's wall clock nor any other machine's is
trusted for it. Orphan-policy sandboxes are never fenced: nobody starts them elsewhere. A sandbox an
operator paused is not the fence's: it is neither frozen again nor thawed by it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from corral.core.runlease import LeaseState, RunLease
from corral.core.timeouts import FENCE_CHECK_S
from corral.runtime.base import Runtime, RuntimeFailure, SandboxSpec

log = logging.getLogger(__name__)


class _Leased(Protocol):
    @property
    def spec(self) -> SandboxSpec: ...

    paused: bool  # what the agent reports: kept in step with the freezes here


@dataclass(eq=False)
class RunFence:
    host_id: str
    runtime: Runtime
    live: Mapping[str, _Leased]
    _stop: Callable[[str], Awaitable[None]]
    _paused: Callable[[str], bool]
    clock: Callable[[], float] = time.monotonic
    lease: RunLease = field(default_factory=RunLease, init=False)
    # None: no reply yet, so what this host adopted at a restart waits frozen for the first one;
    # False: the control plane grants no lease (an older one), so nothing is fenced.
    granted: bool | None = field(default=None, init=False)
    frozen: set[str] = field(default_factory=set, init=False)  # frozen by the fence, to thaw on renewal
    frozen_total: int = field(default=0, init=False)
    stopped_total: int = field(default=0, init=False)

    def now(self) -> float:
        return self.clock()

    def renewed(self, sent_at: float, lease_s: float | None, dead_after_s: float | None) -> None:
        """A reply to the heartbeat sent at ``sent_at`` (on :meth:`now`'s clock)."""
        if lease_s is None:
            self.granted = self.granted or False
            return
        self.granted = True
        self.lease.renew(sent_at, lease_s, dead_after_s)

    def state(self) -> LeaseState:
        if self.granted is None:
            return LeaseState.LAPSED
        return self.lease.state(self.now()) if self.granted else LeaseState.HELD

    def _leased(self) -> list[str]:
        return sorted(sid for sid, live in self.live.items() if live.spec.leased)

    async def check(self, stopped: Collection[str] = ()) -> LeaseState:
        """Bring the leased sandboxes in line with the lease: frozen while it is lapsed, stopped once
        it expired, thawed when it is held again (``stopped``: what the last reply said to stop,
        never thawed)."""
        state = self.state()
        if state is LeaseState.HELD:
            for sid in sorted(self.frozen):
                self.frozen.discard(sid)
                live = self.live.get(sid)
                if (
                    live is not None
                    and sid not in stopped
                    and await self._quietly(self.runtime.resume, sid, "thawed: the lease is held again")
                ):
                    live.paused = False
            return state
        for sid in self._leased():
            if state is LeaseState.EXPIRED:
                self.frozen.discard(sid)
                self.stopped_total += 1
                log.warning(
                    "agent %s: stopping %s: declared dead by now, it runs elsewhere", self.host_id, sid
                )
                try:
                    await self._stop(sid)
                except Exception as exc:
                    log.warning("agent %s: could not stop %s: %r", self.host_id, sid, exc)
            elif (
                sid not in self.frozen
                and not self._paused(sid)
                and await self._quietly(self.runtime.pause, sid, "frozen: the run lease lapsed")
            ):
                self.live[sid].paused = True
                self.frozen.add(sid)
                self.frozen_total += 1
        return state

    async def _quietly(self, op: Callable[[str], Awaitable[None]], sid: str, what: str) -> bool:
        try:
            await op(sid)
        except RuntimeFailure as exc:
            log.warning("agent %s: %s not %s: %r", self.host_id, sid, what.split(":")[0], exc)
            return False
        log.warning("agent %s: %s %s", self.host_id, sid, what)
        return True

    async def run(self) -> None:
        """Check the lease every ``FENCE_CHECK_S`` until cancelled."""
        while True:
            try:
                await self.check()
            except Exception:
                log.warning("agent %s: fence check failed", self.host_id, exc_info=True)
            await asyncio.sleep(FENCE_CHECK_S)
