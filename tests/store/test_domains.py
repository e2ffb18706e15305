"""Custom domains in the store: one name, one live sandbox, fleet-wide (of two concurrent binds
one commits, the other is DomainTaken), a gone holder's name taken over, removed with the record."""

from __future__ import annotations

import asyncio

import pytest

from corral.store import DomainTaken, RecordNotFound, SandboxState, Store, TenantRecord, open_store

from .helpers import sandbox


@pytest.fixture
async def tenant(store: Store) -> TenantRecord:
    return await store.create_tenant("acme", max_sandboxes=10, max_memory_mb=8192)


async def test_a_name_is_held_by_one_sandbox_and_goes_with_it(store: Store, tenant: TenantRecord) -> None:
    await store.create_sandbox(sandbox("a", tenant))
    await store.create_sandbox(sandbox("b", tenant))
    bound = await store.bind_domain("app.example.com", "a", 8080)
    assert (bound.sandbox_id, bound.tenant_id, bound.port) == ("a", tenant.id, 8080)
    assert await store.get_domain("app.example.com") == bound
    with pytest.raises(DomainTaken):
        await store.bind_domain("app.example.com", "b", 9000)
    # The holder binding it again moves its port; another name is another row.
    assert (await store.bind_domain("app.example.com", "a", 9000)).port == 9000
    await store.bind_domain("api.example.com", "a", 80)
    assert [d.hostname for d in await store.list_domains("a")] == ["api.example.com", "app.example.com"]
    with pytest.raises(RecordNotFound):
        await store.bind_domain("x.example.com", "missing", 80)
    assert not await store.unbind_domain("api.example.com", "b")  # not b's to remove
    assert await store.unbind_domain("api.example.com", "a")
    assert await store.delete_sandbox("a")
    assert await store.get_domain("app.example.com") is None
    assert (await store.bind_domain("app.example.com", "b", 80)).sandbox_id == "b"


async def test_a_gone_holders_name_is_taken_over(store: Store, tenant: TenantRecord) -> None:
    await store.create_sandbox(sandbox("old", tenant))
    await store.create_sandbox(sandbox("new", tenant))
    await store.bind_domain("app.example.com", "old", 80)
    await store.set_sandbox_state("old", SandboxState.DELETED)  # a tombstone, not yet removed
    with pytest.raises(RecordNotFound):
        await store.bind_domain("other.example.com", "old", 80)
    assert (await store.bind_domain("app.example.com", "new", 80)).sandbox_id == "new"


async def test_concurrent_binds_from_two_stores_one_wins(
    store_url: str, store: Store, tenant: TenantRecord
) -> None:
    for i in range(8):
        await store.create_sandbox(sandbox(f"s{i}", tenant))
    other = open_store(store_url)
    try:
        stores = [store, other]
        got = await asyncio.gather(
            *(stores[i % 2].bind_domain("race.example.com", f"s{i}", 80) for i in range(8)),
            return_exceptions=True,
        )
    finally:
        await other.close()
    won = [g for g in got if not isinstance(g, BaseException)]
    assert len(won) == 1, got
    assert all(isinstance(g, DomainTaken) for g in got if isinstance(g, BaseException)), got
    held = await store.get_domain("race.example.com")
    assert held is not None and held.sandbox_id == won[0].sandbox_id
