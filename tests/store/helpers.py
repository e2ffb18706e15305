"""Small builders shared by the store tests."""

from __future__ import annotations

from corral.core import AdmissionMode, HostFacts
from corral.store import HostReport, Listing, SandboxRecord, Store, TenantRecord


def beat(
    host_id: str,
    seq: int,
    *,
    admittable: int = 10_000,
    total: int = 16_384,
    sandbox_ids: frozenset[str] = frozenset(),
    epochs: dict[str, int] | None = None,
    listing: Listing | None = None,
    **kw: object,
) -> HostReport:
    """A heartbeat whose listing is ``listing``, or the whole set ``sandbox_ids`` (at ``epochs``)."""
    facts = HostFacts(
        cpu_total=kw.pop("cpu_total", 16.0),  # type: ignore[arg-type]
        cpu_used=kw.pop("cpu_used", 1.0),  # type: ignore[arg-type]
        memory_mb_total=total,
        memory_mb_used=total - admittable,
        memory_mb_admittable=admittable,
        memory_admission=AdmissionMode.WORKING_SET,
        **{
            k: kw.pop(k)
            for k in ("templates", "runtime", "gpu", "role", "stream_restore", "images")
            if k in kw
        },  # type: ignore[arg-type]
    )
    if listing is None:
        listing = Listing(None, {i: (epochs or {}).get(i, 0) for i in sandbox_ids})
    return HostReport(host_id=host_id, seq=seq, facts=facts, listing=listing, **kw)  # type: ignore[arg-type]


async def hosts(store: Store, n: int, *, admittable: int = 10_000) -> list[str]:
    ids = [f"h{i:02d}" for i in range(n)]
    for h in ids:
        await store.upsert_heartbeat(beat(h, 1, admittable=admittable))
    return ids


def sandbox(
    sid: str,
    tenant: TenantRecord,
    *,
    name: str | None = None,
    memory_mb: int = 512,
    cpus: float = 1.0,
    **kw: object,
) -> SandboxRecord:
    return SandboxRecord(
        id=sid,
        tenant_id=tenant.id,
        template="default",
        memory_mb=memory_mb,
        cpus=cpus,
        name=name,
        **kw,  # type: ignore[arg-type]
    )
