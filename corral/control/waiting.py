"""Creates that wait for capacity. A create with ``wait_s`` that nothing can take now is parked: its
record stays, in ``waiting_capacity`` until a deadline, so it outlives the replica that parked it. The
leader places parked creates every round through the ordinary placement path, round-robin across
tenants and first-come first-served within one; the request that parked it (or a retry with the same
Idempotency-Key, on any replica) answers 201 once it runs, or 503 at the deadline. A parked create
without a key whose client has gone is cancelled."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from dataclasses import dataclass, field

from corral.codes import ErrorCode
from corral.control.config import ControlConfig
from corral.control.errors import InvalidRequest, QueueFull, Unavailable
from corral.control.metrics import Metrics
from corral.control.placement import Placement, Start
from corral.control.ports import WaitingQueue
from corral.control.seal import Sealer, open_spec
from corral.core import Clock
from corral.store import SandboxRecord, SandboxState, StateConflict, StoreError

log = logging.getLogger("corral.waiting")

WAITING_BATCH = 1000


@dataclass(eq=False, repr=False)
class WaitingCreates:
    store: WaitingQueue
    placement: Placement
    sealer: Sealer | None
    clock: Clock
    config: ControlConfig
    metrics: Metrics
    # How often a waiting request looks at its record: well within one leader round.
    poll_s: float = field(init=False)

    def __post_init__(self) -> None:
        self.poll_s = max(0.02, min(0.25, self.config.reconcile_interval_s / 4))

    def check(self, wait_s: float) -> None:
        if not 0 < wait_s <= self.config.max_wait_s:
            raise InvalidRequest("wait_s", f"wait_s: more than 0 and at most {self.config.max_wait_s:g}")

    async def queued(self, tenant_id: str) -> bool:
        page = await self.store.list_sandboxes(
            tenant_id=tenant_id, state=SandboxState.WAITING_CAPACITY, limit=1
        )
        return bool(page.items)

    async def park(self, record: SandboxRecord, wait_s: float) -> SandboxRecord:
        page = await self.store.list_sandboxes(
            tenant_id=record.tenant_id,
            state=SandboxState.WAITING_CAPACITY,
            limit=min(1000, self.config.max_waiting_per_tenant + 1),
        )
        if len(page.items) >= self.config.max_waiting_per_tenant:
            raise QueueFull(
                f"{len(page.items)} creates of this tenant already wait for capacity",
                details={"limit": self.config.max_waiting_per_tenant},
            )
        return await self.store.park_sandbox(record.id, self.clock.now() + wait_s)

    async def wait(self, parked: SandboxRecord, idempotency_key: str | None) -> SandboxRecord:
        """Until the leader placed it (its record as placed), or its deadline (503)."""
        try:
            while True:
                rec = await self.store.get_sandbox(parked.id)
                if rec is None or rec.state is SandboxState.DELETED:
                    raise self._expired(parked)
                if rec.state is not SandboxState.WAITING_CAPACITY:
                    return rec
                if rec.wait_until is not None and self.clock.now() >= rec.wait_until:
                    if await self.cancel(rec):
                        raise self._expired(parked)
                    continue  # placed at the last moment: its state says so on the next read
                await asyncio.sleep(self.poll_s)
        except asyncio.CancelledError:
            if idempotency_key is None:
                # Nobody can ever come back for it: it must not take room later.
                with contextlib.suppress(Exception):
                    await asyncio.shield(self.cancel(parked))
            raise

    def _expired(self, rec: SandboxRecord) -> Unavailable:
        self.metrics.refusals.labels(ErrorCode.NO_CAPACITY).inc()
        return Unavailable(
            f"waited for capacity until the deadline; nothing fit sandbox {rec.id}",
            retry_after_s=self.config.retry_after_min_s,
            details={"sandbox_id": rec.id},
        )

    async def cancel(self, rec: SandboxRecord) -> bool:
        """End a parked create that is still parked; False when it was placed meanwhile."""
        try:
            await self.store.set_sandbox_state(
                rec.id, SandboxState.DELETED, expect=SandboxState.WAITING_CAPACITY
            )
        except StateConflict:
            return False
        except StoreError:
            return True  # gone already
        await self.store.delete_sandbox(rec.id, forget_idempotency=True)
        return True

    async def place_waiting(self) -> None:
        """The leader's round: expire what is past its deadline, then place round-robin across tenants,
        in order within each, until each tenant's first waiting create does not fit."""
        page = await self.store.list_sandboxes(state=SandboxState.WAITING_CAPACITY, limit=WAITING_BATCH)
        self.metrics.waiting.set(len(page.items))
        if not page.items:
            return
        now = self.clock.now()
        queues: dict[str, deque[SandboxRecord]] = {}
        for rec in page.items:  # oldest first
            if rec.wait_until is not None and now >= rec.wait_until:
                await self.cancel(rec)
                continue
            queues.setdefault(rec.tenant_id, deque()).append(rec)
        while queues:
            for tenant in list(queues):
                q = queues[tenant]
                if not await self._place_one(q[0]):
                    del queues[tenant]  # its first does not fit: nothing after it may pass it
                    continue
                q.popleft()
                if not q:
                    del queues[tenant]

    async def _place_one(self, rec: SandboxRecord) -> bool:
        spec = await open_spec(self.placement.store, self.sealer, rec.id)
        try:
            placed = await self.placement.place(Start.of(rec, spec))
        except Unavailable:
            return False
        except Exception as exc:
            log.warning("placing waiting create %s failed this round: %r", rec.id, exc)
            return False
        self.metrics.waited.observe(max(0.0, self.clock.now() - rec.created_at))
        self.metrics.placements.labels(placed.host_id or "").inc()
        return True
