"""A tenant removed: refused while any of its sandboxes is live (parked creates included), otherwise its
tokens revoked and its ended records, Idempotency-Keys and domains gone with it in one transaction, so a
tenant made later under its name owns nothing of it; and no create can slip in between the check and
the delete, however the two race."""

from __future__ import annotations

import asyncio
import random

import pytest

from corral.store import (
    RecordNotFound,
    Role,
    SandboxRecord,
    SandboxState,
    Store,
    TenantHasSandboxes,
    TenantRecord,
    TokenRevoked,
    Usage,
    open_store,
)

from .helpers import sandbox
from .test_tenants import raw_rows


async def _acme_with_one_of_each(store: Store) -> TenantRecord:
    """acme: a running sandbox (named, made under an Idempotency-Key, holding a domain), a parked create,
    a stopped and a failed record, and a tombstone its host has not stopped yet."""
    t = await store.create_tenant("acme", max_sandboxes=10, max_memory_mb=10_000)
    await store.create_sandbox(sandbox("sb-run", t, name="db"), idempotency_key="k1", request_hash="x")
    await store.set_sandbox_state("sb-run", SandboxState.RUNNING, host_id="h1")
    await store.bind_domain("app.example.test", "sb-run", 8080)
    await store.create_sandbox(sandbox("sb-wait", t, state=SandboxState.WAITING_CAPACITY))
    for sid, state in (("sb-stop", SandboxState.STOPPED), ("sb-fail", SandboxState.FAILED)):
        await store.create_sandbox(sandbox(sid, t))
        await store.set_sandbox_state(sid, state)
    await store.create_sandbox(sandbox("sb-tomb", t))
    await store.set_sandbox_state("sb-tomb", SandboxState.DELETED, host_id="h1")
    return t


async def test_a_tenant_with_live_sandboxes_is_kept_whole(store: Store) -> None:
    t = await _acme_with_one_of_each(store)
    token = await store.issue_token(t.id, Role.TENANT)
    with pytest.raises(TenantHasSandboxes) as refused:
        await store.delete_tenant(t.id)
    assert (refused.value.live, refused.value.code) == (2, "tenant_has_sandboxes")  # running + parked
    # The parked create alone still holds it.
    await store.set_sandbox_state("sb-run", SandboxState.STOPPED)
    with pytest.raises(TenantHasSandboxes) as refused:
        await store.delete_tenant(t.id)
    assert refused.value.live == 1
    assert await store.get_tenant(t.id) == t and await store.resolve_token(token) is not None
    assert len((await store.list_sandboxes(limit=100)).items) == 5


async def test_a_removed_tenant_takes_its_tokens_ended_records_and_keys(store: Store, store_url: str) -> None:
    t = await _acme_with_one_of_each(store)
    other = await store.create_tenant("beta", max_sandboxes=1, max_memory_mb=1000)
    token = await store.issue_token(t.id, Role.TENANT)
    e2b_key = "e2b_" + "ab" * 20
    await store.ensure_token(e2b_key, t.id, Role.TENANT)
    kept = await store.issue_token(other.id, Role.TENANT)
    await store.create_sandbox(sandbox("sb-beta", other))
    await store.set_sandbox_state("sb-run", SandboxState.STOPPED)
    await store.delete_sandbox("sb-wait")
    epoch = await store.auth_epoch()

    assert await store.delete_tenant(t.id) is True

    assert await store.get_tenant(t.id) is None and await store.get_tenant_by_name("acme") is None
    assert await store.resolve_token(token) is None and await store.resolve_token(e2b_key) is None
    assert await store.auth_epoch() > epoch  # the other replicas drop their cached principals
    with pytest.raises(TokenRevoked):  # and neither comes back as a configured token, in any role
        await store.ensure_token(e2b_key, None, Role.ADMIN)
    assert await store.resolve_token(kept) is not None
    # The tombstone stays for the reconciler to stop on its host; every other record of acme is gone.
    left = {sb.id: sb.tenant_id for sb in (await store.list_sandboxes(limit=100)).items}
    assert left == {"sb-tomb": t.id, "sb-beta": other.id}
    assert raw_rows(store_url, f"SELECT * FROM idempotency_keys WHERE tenant_id = '{t.id}'") == []
    assert raw_rows(store_url, f"SELECT * FROM sandbox_domains WHERE tenant_id = '{t.id}'") == []
    assert raw_rows(store_url, f"SELECT * FROM tokens WHERE tenant_id = '{t.id}'") == []
    assert await store.audit() == []
    # Nothing more to remove, and nothing more can be written for it.
    assert await store.delete_tenant(t.id) is False and await store.delete_tenant("tn_nope") is False
    with pytest.raises(RecordNotFound):
        await store.create_sandbox(sandbox("sb-late", t))


async def test_a_new_tenant_of_the_same_name_starts_clean(store: Store) -> None:
    t = await _acme_with_one_of_each(store)
    await store.set_sandbox_state("sb-run", SandboxState.STOPPED)
    await store.delete_sandbox("sb-wait")
    await store.issue_token(t.id, Role.TENANT)
    assert await store.delete_tenant(t.id) is True

    again = await store.create_tenant("acme", max_sandboxes=1, max_memory_mb=512)
    assert again.id != t.id
    assert await store.usage(again.id) == Usage(0, 0, 0.0)
    assert await store.list_tokens(tenant_id=again.id) == []
    assert (await store.list_sandboxes(tenant_id=again.id, limit=100)).items == []
    # The old name and Idempotency-Key are free: a create under them is a new sandbox, not a replay,
    # and the new quota (one sandbox) is the new tenant's alone.
    made = await store.create_sandbox(
        sandbox("sb-new", again, name="db"), idempotency_key="k1", request_hash="y"
    )
    assert (made.record.id, made.replayed) == ("sb-new", False)
    assert await store.usage(again.id) == Usage(1, 512, 1.0)


async def _create_after(store: Store, delay: float, record: SandboxRecord) -> bool:
    await asyncio.sleep(delay)
    try:
        await store.create_sandbox(record)
    except RecordNotFound:  # its tenant was removed first
        return False
    return True


async def _remove_after(store: Store, delay: float, tenant_id: str) -> bool:
    await asyncio.sleep(delay)
    try:
        return await store.delete_tenant(tenant_id)
    except TenantHasSandboxes:  # a create committed first
        return False


async def test_a_create_racing_a_removal_never_outlives_its_tenant(store_url: str) -> None:
    """Two store clients (two connections, on PostgreSQL), one creating the tenant's sandboxes while
    the other removes it, at random offsets: either the removal is refused (a create committed first)
    or every create after it is refused (it committed first). Never a sandbox whose tenant is gone."""
    creator, remover = open_store(store_url), open_store(store_url)
    await creator.migrate()
    rng = random.Random(11)
    outcomes = {"removed": 0, "refused": 0}
    try:
        for n in range(40):
            t = await creator.create_tenant(f"racer-{n}", max_sandboxes=10, max_memory_mb=10_000)
            creates = [
                _create_after(creator, rng.uniform(0, 0.004), sandbox(f"sb-{n}-{i}", t, memory_mb=256))
                for i in range(3)
            ]
            *made, removed = await asyncio.gather(
                *creates, _remove_after(remover, rng.uniform(0, 0.004), t.id)
            )
            assert not (removed and any(made)), (n, made, removed)
            assert (await creator.get_tenant(t.id) is None) == removed
            left = (await creator.list_sandboxes(tenant_id=t.id, limit=100)).items
            assert not (removed and left), left
            outcomes["removed" if removed else "refused"] += 1
        assert await creator.audit() == []
        # Both orders happened: the race was a real one.
        assert outcomes["removed"] > 0 and outcomes["refused"] > 0, outcomes
    finally:
        await creator.close()
        await remover.close()
