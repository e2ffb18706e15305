"""The change feed (migration 21): every write to a sandbox, template or pool row at one store-wide
version, in commit order, kept as a bounded history; a replica is woken when another commits."""

from __future__ import annotations

import asyncio

import pytest

from corral.core import ManualClock
from corral.store import NameConflict, SandboxState, Store, TemplateRecord, open_store

from .helpers import sandbox


async def test_writes_become_versions_in_order(store: Store) -> None:
    _, start = await store.change_bounds()
    tenant = await store.create_tenant("acme", max_sandboxes=10, max_memory_mb=10_000)
    await store.create_sandbox(sandbox("sb1", tenant, name="one"))
    await store.set_sandbox_state("sb1", SandboxState.RUNNING, host_id="h1")
    await store.create_template(TemplateRecord("py", cpus=1, memory_mb=256))
    await store.create_pool("py", size=2)
    await store.update_pool("py", size=3)
    await store.delete_pool("py")
    assert await store.delete_sandbox("sb1")
    got = await store.changes_since(start)
    assert [c.version for c in got] == list(range(start + 1, start + 1 + len(got)))
    assert [(c.kind, c.key, c.deleted) for c in got] == [
        ("sandbox", "sb1", False),
        ("sandbox", "sb1", False),
        ("template", "py", False),
        ("pool", "py", False),
        ("pool", "py", False),
        ("pool", "py", True),
        ("sandbox", "sb1", True),
    ]
    assert (got[0].tenant_id, got[0].name) == (tenant.id, "one")
    assert got[2].tenant_id is None
    assert await store.change_bounds() == (start, got[-1].version)
    assert await store.changes_since(got[-1].version) == []
    assert [c.version for c in await store.changes_since(start, limit=2)] == [start + 1, start + 2]
    # A failed write (a name taken) leaves no change behind.
    await store.create_sandbox(sandbox("sb2", tenant, name="two"))
    before = (await store.change_bounds())[1]
    with pytest.raises(NameConflict):
        await store.create_sandbox(sandbox("sb3", tenant, name="two"))
    assert (await store.change_bounds())[1] == before


async def test_prune_keeps_the_newest(store: Store) -> None:
    tenant = await store.create_tenant("acme", max_sandboxes=100, max_memory_mb=100_000)
    for i in range(6):
        await store.create_sandbox(sandbox(f"sb{i}", tenant))
    _, latest = await store.change_bounds()
    assert await store.prune_changes(2) >= 4
    oldest, latest_after = await store.change_bounds()
    assert (oldest, latest_after) == (latest - 2, latest)
    assert [c.key for c in await store.changes_since(0)] == ["sb4", "sb5"]
    assert await store.get_sandbox_by_name(tenant.id, "missing") is None


async def test_another_replica_is_woken(store_url: str, store: Store, clock: ManualClock) -> None:
    other = open_store(store_url, clock=clock)
    try:
        woken = asyncio.Event()
        stop = (
            other.on_change(woken.set) if store_url.startswith("postgresql") else store.on_change(woken.set)
        )
        await asyncio.sleep(0.2)  # the listener's connection is up
        woken.clear()
        tenant = await store.create_tenant("acme", max_sandboxes=10, max_memory_mb=10_000)
        await store.create_sandbox(sandbox("sb1", tenant, name="n1"))
        await asyncio.wait_for(woken.wait(), 2)
        stop()
        found = await other.get_sandbox_by_name(tenant.id, "n1")
        assert found is not None and found.id == "sb1"
    finally:
        await other.close()


async def test_concurrent_writers_are_seen_in_version_order(
    store_url: str, store: Store, clock: ManualClock
) -> None:
    """Two replicas writing at once: a reader that follows the feed never sees a version appear
    behind one it has already passed."""
    other = open_store(store_url, clock=clock)
    try:
        tenant = await store.create_tenant("acme", max_sandboxes=1000, max_memory_mb=1_000_000)
        _, seen = await store.change_bounds()
        followed: list[int] = []
        done = False

        async def follow() -> None:
            nonlocal seen
            while not done or (await store.change_bounds())[1] > seen:
                for c in await store.changes_since(seen):
                    followed.append(c.version)
                    seen = c.version
                await asyncio.sleep(0)

        async def write(s: Store, prefix: str) -> None:
            for i in range(30):
                await s.create_sandbox(sandbox(f"{prefix}{i}", tenant))

        follower = asyncio.create_task(follow())
        await asyncio.gather(write(store, "a"), write(other, "b"))
        done = True
        await follower
        assert len(followed) == 60
        assert followed == sorted(followed) == list(range(followed[0], followed[0] + 60))
    finally:
        await other.close()
