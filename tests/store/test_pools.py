"""Warm pools in the store: the intent (a pool per template, targets per host), a host's warm counts
on its heartbeat row, a claimed sandbox's warm flag, and the create checks read without writing."""

from __future__ import annotations

import pytest

from corral.store import (
    UNSET,
    IdempotencyMismatch,
    InvalidRecord,
    NameConflict,
    QuotaExceeded,
    RecordNotFound,
    SandboxState,
    Store,
    TemplateRecord,
)

from .helpers import beat, sandbox


async def test_pool_lifecycle_and_targets(store: Store) -> None:
    await store.create_template(TemplateRecord("py", cpus=1, memory_mb=256))
    pool = await store.create_pool("py", size=10, max_per_host=3)
    assert (pool.template, pool.size, pool.max_per_host, dict(pool.targets)) == ("py", 10, 3, {})
    with pytest.raises(NameConflict):
        await store.create_pool("py", size=1)
    with pytest.raises(RecordNotFound):
        await store.create_pool("nope", size=1)
    for bad in ({"size": -1}, {"size": 1, "max_per_host": 0}):
        with pytest.raises(InvalidRecord):
            await store.create_pool("default", **bad)  # type: ignore[arg-type]
    assert await store.set_pool_targets("py", {"h1": 3, "h2": 0, "h3": 2})
    (listed,) = await store.list_pools()
    assert dict(listed.targets) == {"h1": 3, "h3": 2}  # zero targets are no rows
    assert await store.set_pool_targets("py", {"h2": 4})
    assert dict((await store.list_pools())[0].targets) == {"h2": 4}
    updated = await store.update_pool("py", size=20)
    assert (updated.size, updated.max_per_host) == (20, 3)
    updated = await store.update_pool("py", max_per_host=None)
    assert updated.max_per_host is None and updated.size == 20
    assert (await store.update_pool("py", max_per_host=UNSET)).max_per_host is None
    with pytest.raises(RecordNotFound):
        await store.update_pool("nope", size=1)
    assert await store.delete_pool("py")
    assert not await store.delete_pool("py")
    assert await store.list_pools() == []
    assert not await store.set_pool_targets("py", {"h1": 1})  # a deleted pool takes no targets


async def test_heartbeat_keeps_warm_counts(store: Store) -> None:
    await store.upsert_heartbeat(beat("h1", 1, warm={"py": (3, 1), "go": (0, 2)}))
    host = await store.get_host("h1")
    assert host is not None and dict(host.warm) == {"py": (3, 1), "go": (0, 2)}
    assert host.warm_ready("py") == 3 and host.warm_ready("rust") == 0
    await store.upsert_heartbeat(beat("h1", 2))
    host = await store.get_host("h1")
    assert host is not None and dict(host.warm) == {}


async def test_warm_flag_and_read_only_create_checks(store: Store) -> None:
    tenant = await store.create_tenant("t", max_sandboxes=2, max_memory_mb=10_000)
    first = sandbox("sb-1", tenant, name="one", warm=True, state=SandboxState.RUNNING, host_id="h1")
    assert await store.check_create(first, idempotency_key="k1", request_hash="a") is None
    assert await store.get_sandbox("sb-1") is None  # checked, not written
    out = await store.create_sandbox(first, idempotency_key="k1", request_hash="a")
    assert out.record.warm and (await store.get_sandbox("sb-1")).warm  # type: ignore[union-attr]
    replay = await store.check_create(sandbox("sb-x", tenant), idempotency_key="k1", request_hash="a")
    assert replay is not None and replay.replayed and replay.record.id == "sb-1"
    with pytest.raises(IdempotencyMismatch):
        await store.check_create(sandbox("sb-x", tenant), idempotency_key="k1", request_hash="b")
    with pytest.raises(NameConflict):
        await store.check_create(sandbox("sb-x", tenant, name="one"))
    await store.create_sandbox(sandbox("sb-2", tenant))
    with pytest.raises(QuotaExceeded):
        await store.check_create(sandbox("sb-3", tenant))
    with pytest.raises(RecordNotFound):
        await store.check_create(sandbox("sb-3", tenant.__class__("ghost", "ghost", 1, 1, 0.0)))
