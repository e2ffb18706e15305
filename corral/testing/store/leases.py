"""Leases in the store model: replicas' liveness (a reservation ends with its owner's lease) and the
single leader."""

from __future__ import annotations

from collections.abc import Collection

from corral.store.records import (
    SandboxState,
    check_ttl,
)
from corral.testing.store.base import ModelBase


class LeasesModel(ModelBase):
    async def renew_replica(self, replica_id: str, ttl_s: float) -> float:
        check_ttl(ttl_s)
        await self._enter()
        self.replicas[replica_id] = expires_at = self._now() + ttl_s
        return expires_at

    async def live_replicas(self) -> int:
        await self._enter()
        now = self._now()
        return sum(1 for exp in self.replicas.values() if exp > now)

    async def expire_replicas(self) -> list[str]:
        await self._enter()
        now = self._now()
        lapsed = sorted(r for r, exp in self.replicas.items() if exp <= now)
        for replica_id in lapsed:
            self._end([r.id for r in self.reservations.values() if r.owner == replica_id])
            del self.replicas[replica_id]
            self.leases_ended[replica_id] = now
        return lapsed

    async def abandoned(self, sandbox_ids: Collection[str]) -> set[str]:
        await self._enter()
        now = self._now()
        out = set()
        for sid in set(sandbox_ids):
            sb = self.sandboxes.get(sid)
            if sb is None or sb.state is not SandboxState.RESERVED or sb.owner is None:
                continue
            if self.replicas.get(sb.owner, now) <= now:
                out.add(sid)
        return out

    async def try_lead(self, name: str, holder: str, ttl_s: float) -> bool:
        check_ttl(ttl_s)
        await self._enter()
        now = self._now()
        held = self.leases.get(name)
        if held is not None and held[0] != holder and held[1] > now:
            return False
        self.leases[name] = (holder, now + ttl_s)
        return True
