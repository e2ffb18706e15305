"""Failover in the store model: a dead host's sandboxes orphaned or moved under a new epoch with
fences, parked creates, sealed specs."""

from __future__ import annotations

from dataclasses import replace

from corral.core.types import HostState
from corral.store.errors import (
    StateConflict,
)
from corral.store.records import (
    FailedHost,
    SandboxRecord,
    SandboxState,
)
from corral.testing.store.base import ModelBase


class FailoverModel(ModelBase):
    async def fail_host(self, host_id: str, dead_before: float, *, evacuate: bool = False) -> FailedHost:
        await self._enter()
        now = self._now()
        h = self.hosts.get(host_id)
        if h is None:
            return FailedHost(0, 0, 0)
        silent = h.heartbeat_at < dead_before
        if not silent and not (evacuate and h.state is HostState.DRAINING):
            return FailedHost(0, 0, 0)
        recreating = orphaned = released = 0
        for sb in list(self.sandboxes.values()):
            if sb.host_id == host_id and sb.state is SandboxState.RUNNING and sb.failover == "recreate":
                self._put(sb, state=SandboxState.RECREATING, updated_at=now)
                recreating += 1
        if silent:
            for sb in list(self.sandboxes.values()):
                if sb.host_id == host_id and sb.state is SandboxState.RUNNING:
                    self._put(sb, state=SandboxState.ORPHANED, updated_at=now)
                    orphaned += 1
            released = self._end([r.id for r in self.reservations.values() if r.host_id == host_id])
            for sb in self.sandboxes.values():  # fenced one epoch ahead, as the SQL stores do
                if sb.host_id == host_id and sb.state is SandboxState.RECREATING:
                    self.fences[(host_id, sb.id)] = sb.epoch + 1
        return FailedHost(orphaned, recreating, released)

    async def reassign_sandbox(
        self, sandbox_id: str, *, expect_version: int, host_id: str, reservation_id: str, placement: str
    ) -> SandboxRecord:
        await self._enter()
        now = self._now()
        sb = self._sandbox(sandbox_id)
        if sb.version != expect_version or sb.state is not SandboxState.RECREATING:
            raise StateConflict(sandbox_id, sb.state, sb.version)
        before = sb.host_id
        rec = self._put(
            sb,
            host_id=host_id,
            epoch=sb.epoch + 1,
            recreated_at=now,
            updated_at=now,
            reservation_id=reservation_id,
        )
        self.placements[sandbox_id] = placement
        hosts = {host for (host, sid) in self.fences if sid == sandbox_id}
        if before:
            hosts.add(before)
        hosts.discard(host_id)
        for key in [k for k in self.fences if k[1] == sandbox_id]:
            del self.fences[key]
        for host in sorted(hosts):
            self.fences[(host, sandbox_id)] = rec.epoch
        return rec

    async def park_sandbox(self, sandbox_id: str, wait_until: float) -> SandboxRecord:
        await self._enter()
        sb = self._sandbox(sandbox_id)
        if sb.state is not SandboxState.RESERVED:
            raise StateConflict(sandbox_id, sb.state, sb.version)
        return self._put(
            sb,
            state=SandboxState.WAITING_CAPACITY,
            wait_until=wait_until,
            host_id=None,
            reservation_id=None,
            updated_at=self._now(),
        )

    async def sealed_spec(self, sandbox_id: str) -> str | None:
        await self._enter()
        sb = self.sandboxes.get(sandbox_id)
        return sb.sealed_spec if sb is not None else None

    async def sealed_specs(self, after_id: str, limit: int) -> list[tuple[str, str]]:
        await self._enter()
        got = sorted(
            (sid, sb.sealed_spec)
            for sid, sb in self.sandboxes.items()
            if sid > after_id and sb.sealed_spec is not None
        )
        return got[:limit]

    async def replace_sealed_spec(self, sandbox_id: str, old: str, new: str) -> bool:
        await self._enter()
        sb = self.sandboxes.get(sandbox_id)
        if sb is None or sb.sealed_spec != old:
            return False
        self.sandboxes[sandbox_id] = replace(sb, sealed_spec=new)  # not a state change: no version
        return True
