"""Tenants in the store model: their quotas and the live usage counted against them."""

from __future__ import annotations

from corral.store import rows
from corral.store.errors import (
    InvalidRecord,
    NameConflict,
)
from corral.store.records import (
    DEFAULT_MAX_CPUS,
    TenantRecord,
    Usage,
    check_tenant_quota,
)
from corral.testing.store.base import ModelBase, _Tenant


class AccessModel(ModelBase):
    async def create_tenant(
        self, name: str, *, max_sandboxes: int, max_memory_mb: int, max_cpus: float = DEFAULT_MAX_CPUS
    ) -> TenantRecord:
        if not name:
            raise InvalidRecord("name: must not be empty")
        check_tenant_quota(max_sandboxes, max_memory_mb, max_cpus)
        await self._enter()
        if any(t.record.name == name for t in self.tenants.values()):
            raise NameConflict(f"tenant {name!r} exists")
        cpus = rows.from_millicores(rows.to_millicores(max_cpus))  # as stored
        rec = TenantRecord("tn_" + self._id(64), name, max_sandboxes, max_memory_mb, self._now(), cpus)
        self.tenants[rec.id] = _Tenant(rec)
        return rec

    async def usage(self, tenant_id: str) -> Usage:
        await self._enter()
        t = self.tenants.get(tenant_id)
        return t.usage() if t is not None else Usage(0, 0, 0.0)
