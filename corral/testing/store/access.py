"""Tenants in the store model: their quotas and the live usage counted against them."""

from __future__ import annotations

from dataclasses import replace

from corral.store import rows
from corral.store.errors import (
    NameConflict,
    RecordNotFound,
    TenantHasSandboxes,
)
from corral.store.records import (
    DEFAULT_MAX_CPUS,
    LIVE_STATES,
    REMOVED_WITH_TENANT,
    TenantRecord,
    Usage,
    check_create_rate,
    check_tenant,
)
from corral.testing.store.base import ModelBase, _Tenant


class AccessModel(ModelBase):
    async def create_tenant(
        self, name: str, *, max_sandboxes: int, max_memory_mb: int, max_cpus: float = DEFAULT_MAX_CPUS
    ) -> TenantRecord:
        check_tenant(name, max_sandboxes, max_memory_mb, max_cpus)
        await self._enter()
        if any(t.record.name == name for t in self.tenants.values()):
            raise NameConflict(f"tenant {name!r} exists")
        cpus = rows.from_millicores(rows.to_millicores(max_cpus))  # as stored
        rec = TenantRecord("tn_" + self._id(64), name, max_sandboxes, max_memory_mb, self._now(), cpus)
        self.tenants[rec.id] = _Tenant(rec)
        return rec

    async def list_tenants(self) -> list[TenantRecord]:
        await self._enter()
        return sorted((t.record for t in self.tenants.values()), key=lambda r: r.name)

    async def set_create_rate(
        self, tenant_id: str, *, rate_per_s: float | None, burst: int | None
    ) -> TenantRecord:
        check_create_rate(rate_per_s, burst)
        await self._enter()
        t = self.tenants.get(tenant_id)
        if t is None:
            raise RecordNotFound(f"tenant {tenant_id!r}")
        t.record = replace(t.record, create_rate_per_s=rate_per_s, create_burst=burst)
        return t.record

    async def delete_tenant(self, tenant_id: str) -> bool:
        """As the SQL stores: refused while a sandbox of its is live; its ended records and keys go
        with it, its tombstones stay (the model keeps no tokens or domains)."""
        await self._enter()
        if tenant_id not in self.tenants:
            return False
        mine = [sb for sb in self.sandboxes.values() if sb.tenant_id == tenant_id]
        live = sum(sb.state in LIVE_STATES for sb in mine)
        if live:
            raise TenantHasSandboxes(tenant_id, live)
        for sb in mine:
            if sb.state in REMOVED_WITH_TENANT:
                del self.sandboxes[sb.id]
                self.placements.pop(sb.id, None)
        for key in [k for k in self.idempotency if k[0] == tenant_id]:
            del self.idempotency[key]
        del self.tenants[tenant_id]
        return True

    async def usage(self, tenant_id: str) -> Usage:
        await self._enter()
        t = self.tenants.get(tenant_id)
        return t.usage() if t is not None else Usage(0, 0, 0.0)
