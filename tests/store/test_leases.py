"""Leases: a replica's reservations end when its lease lapses; one leader at a time, taken over after
expiry."""

from __future__ import annotations

import pytest

from corral.core import ManualClock, Pending
from corral.store import InvalidRecord, SandboxState, Store

from .conftest import T0
from .helpers import hosts, sandbox


async def test_lapsed_replica_loses_its_reservations(store: Store, clock: ManualClock) -> None:
    await hosts(store, 2)
    assert await store.renew_replica("r1", 10) == T0 + 10
    assert await store.renew_replica("r2", 10) == T0 + 10
    for h in ("h00", "h01"):
        assert await store.reserve(h, memory_mb=100, owner="r1", ttl_s=600)
    assert await store.reserve("h00", memory_mb=50, owner="r2", ttl_s=600)
    clock.advance(5)
    assert await store.renew_replica("r2", 10) == T0 + 15
    assert await store.expire_replicas() == []
    clock.advance(5)
    # r1 stopped renewing: its lease lapsed at T0 + 10, long before its reservations' own TTL.
    assert await store.expire_replicas() == ["r1"]
    assert await store.outstanding() == {"h00": Pending(50, 0.0)}
    assert await store.expire_replicas() == []
    assert await store.audit() == []


async def test_clean_release(store: Store) -> None:
    await hosts(store, 1)
    await store.renew_replica("r1", 10)
    assert await store.reserve("h00", memory_mb=100, owner="r1", ttl_s=600)
    assert await store.release_replica("r1") == 1
    assert await store.outstanding() == {}
    assert await store.release_replica("r1") == 0


async def test_single_leader_reentrant_and_taken_over_after_expiry(store: Store, clock: ManualClock) -> None:
    assert await store.try_lead("reconciler", "a", 10) is True
    assert await store.try_lead("reconciler", "b", 10) is False
    clock.advance(5)
    assert await store.try_lead("reconciler", "a", 10) is True  # renewed: now until T0 + 15
    clock.advance(9)
    assert await store.try_lead("reconciler", "b", 10) is False
    clock.advance(1)
    assert await store.try_lead("reconciler", "b", 10) is True
    assert await store.try_lead("reconciler", "a", 10) is False
    # Another lease name is independent.
    assert await store.try_lead("other", "a", 10) is True
    assert await store.resign("reconciler", "a") is False
    assert await store.resign("reconciler", "b") is True
    assert await store.try_lead("reconciler", "a", 10) is True
    with pytest.raises(InvalidRecord):
        await store.try_lead("reconciler", "a", 0)
    with pytest.raises(InvalidRecord):
        await store.renew_replica("r", -1)


async def test_a_reserved_record_is_abandoned_once_its_owners_lease_lapses(
    store: Store, clock: ManualClock
) -> None:
    tenant = await store.create_tenant("acme", max_sandboxes=10, max_memory_mb=1 << 20)
    await store.renew_replica("r1", 10)
    await store.renew_replica("r2", 30)
    for sid, owner in (("sb-1", "r1"), ("sb-2", "r2"), ("sb-3", None), ("sb-4", "r1"), ("sb-5", "never")):
        await store.create_sandbox(sandbox(sid, tenant, owner=owner))
    await store.set_sandbox_state("sb-4", SandboxState.RUNNING, host_id="h00")
    ids = ["sb-1", "sb-2", "sb-3", "sb-4", "sb-5", "sb-none"]
    assert (await store.get_sandbox("sb-1")).owner == "r1"  # type: ignore[union-attr]
    # A replica that holds no lease at all (never renewed, or forgotten) owns nothing alive.
    assert await store.abandoned(ids) == {"sb-5"}
    clock.advance(10)
    # r1's lease lapsed at T0 + 10 (not yet expired by the leader: lapsed is enough). A record with no
    # owner, or no longer reserved, is never abandoned.
    assert await store.abandoned(ids) == {"sb-1", "sb-5"}
    assert await store.expire_replicas() == ["r1"]
    assert await store.abandoned(ids) == {"sb-1", "sb-5"}
    await store.release_replica("r2")
    assert await store.abandoned(ids) == {"sb-1", "sb-2", "sb-5"}
    await store.renew_replica("r1", 10)  # a replica back under the same id owns its records again
    assert await store.abandoned(ids) == {"sb-2", "sb-5"}
    assert await store.abandoned([]) == set()


async def test_live_replicas_counts_the_leases_that_have_not_lapsed(store: Store, clock: ManualClock) -> None:
    assert await store.live_replicas() == 0
    await store.renew_replica("r1", 10)
    await store.renew_replica("r2", 3)
    await store.renew_replica("r1", 10)  # a renewal is still one replica
    assert await store.live_replicas() == 2
    clock.advance(3)
    assert await store.live_replicas() == 1  # r2's lapsed, whether or not it is expired yet
    await store.release_replica("r1")
    assert await store.live_replicas() == 0
