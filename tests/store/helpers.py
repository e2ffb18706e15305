"""Small builders shared by the store tests."""

from __future__ import annotations

from corral.core import AdmissionMode
from corral.store import Heartbeat, SandboxRecord, Store, TenantRecord


def beat(
    host_id: str,
    seq: int,
    *,
    admittable: int = 10_000,
    total: int = 16_384,
    sandbox_ids: frozenset[str] = frozenset(),
    **kw: object,
) -> Heartbeat:
    return Heartbeat(
        host_id=host_id,
        seq=seq,
        cpu_total=kw.pop("cpu_total", 16.0),  # type: ignore[arg-type]
        cpu_used=kw.pop("cpu_used", 1.0),  # type: ignore[arg-type]
        memory_mb_total=total,
        memory_mb_used=total - admittable,
        memory_mb_admittable=admittable,
        memory_admission=AdmissionMode.WORKING_SET,
        sandbox_ids=sandbox_ids,
        **kw,  # type: ignore[arg-type]
    )


async def hosts(store: Store, n: int, *, admittable: int = 10_000) -> list[str]:
    ids = [f"h{i:02d}" for i in range(n)]
    for h in ids:
        await store.upsert_heartbeat(beat(h, 1, admittable=admittable))
    return ids


def sandbox(
    sid: str, tenant: TenantRecord, *, name: str | None = None, memory_mb: int = 512, **kw: object
) -> SandboxRecord:
    return SandboxRecord(
        id=sid,
        tenant_id=tenant.id,
        template="default",
        memory_mb=memory_mb,
        cpus=1.0,
        name=name,
        **kw,  # type: ignore[arg-type]
    )
