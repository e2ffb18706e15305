"""Reservations: conditional on room, ended exactly once, expired ones never counted, batches all or
nothing, and the books (host counters vs reservation rows) always balance."""

from __future__ import annotations

import asyncio

import pytest

from corral.core import ManualClock, Pending
from corral.store import InvalidRecord, ReserveItem, SandboxState, Store

from .conftest import T0
from .helpers import beat, hosts, sandbox


async def test_reserve_is_conditional_on_admittable_minus_reserved(store: Store) -> None:
    await hosts(store, 1, admittable=3000)
    a = await store.reserve("h00", memory_mb=2000, cpu=0.5, owner="r1", ttl_s=30, sandbox_id="sb-1")
    assert a is not None
    assert (a.host_id, a.memory_mb, a.cpu, a.owner, a.sandbox_id) == ("h00", 2000, 0.5, "r1", "sb-1")
    assert (a.created_at, a.expires_at) == (T0, T0 + 30)
    assert await store.reserve("h00", memory_mb=1001, owner="r1", ttl_s=30) is None
    exact = await store.reserve("h00", memory_mb=1000, owner="r1", ttl_s=30)
    assert exact is not None
    assert await store.reserve("h00", memory_mb=1, owner="r1", ttl_s=30) is None
    host = await store.get_host("h00")
    assert host is not None and (host.reserved_mb, host.reserved_cpu) == (3000, 0.5)
    assert await store.get_reservation(a.id) == a
    assert await store.outstanding() == {"h00": Pending(3000, 0.5)}


async def test_unknown_or_draining_host_has_no_room(store: Store) -> None:
    await hosts(store, 1)
    assert await store.reserve("nope", memory_mb=1, owner="r", ttl_s=5) is None
    await store.drain("h00")
    assert await store.reserve("h00", memory_mb=1, owner="r", ttl_s=5) is None
    assert await store.reserve_best(["h00"], memory_mb=1, owner="r", ttl_s=5) is None
    assert await store.reserve_batch([ReserveItem("h00", 1)], owner="r", ttl_s=5) is None
    await store.undrain("h00")
    assert await store.reserve("h00", memory_mb=1, owner="r", ttl_s=5) is not None


async def test_confirm_and_cancel_end_exactly_once(store: Store) -> None:
    await hosts(store, 1, admittable=1000)
    a = await store.reserve("h00", memory_mb=600, owner="r", ttl_s=30)
    b = await store.reserve("h00", memory_mb=400, owner="r", ttl_s=30)
    assert a and b
    assert await store.confirm(a.id) is True
    assert await store.confirm(a.id) is False
    assert await store.cancel(a.id) is False
    assert await store.cancel(b.id) is True
    assert await store.confirm(b.id) is False
    assert await store.cancel("no-such-reservation") is False
    assert await store.outstanding() == {}
    assert (await store.get_host("h00")).reserved_mb == 0  # type: ignore[union-attr]
    assert await store.audit() == []


async def test_cancel_never_touches_a_sandbox(store: Store) -> None:
    await hosts(store, 1)
    tenant = await store.create_tenant("t", max_sandboxes=10, max_memory_mb=10_000)
    r = await store.reserve("h00", memory_mb=512, owner="r", ttl_s=30, sandbox_id="sb-1")
    assert r is not None
    await store.create_sandbox(sandbox("sb-1", tenant, reservation_id=r.id, host_id="h00"))
    placed = await store.set_sandbox_state("sb-1", SandboxState.RUNNING)
    # A late rollback after a successful place: the reservation ends, the sandbox stays running.
    assert await store.cancel(r.id) is True
    after = await store.get_sandbox("sb-1")
    assert after == placed and after is not None and after.state is SandboxState.RUNNING


async def test_expired_reservations_never_count_even_before_a_sweep(store: Store, clock: ManualClock) -> None:
    await hosts(store, 2, admittable=1000)
    short = await store.reserve("h00", memory_mb=1000, owner="r", ttl_s=5)
    long = await store.reserve("h01", memory_mb=300, owner="r", ttl_s=50)
    assert short and long
    assert await store.reserve("h00", memory_mb=1, owner="r", ttl_s=5) is None
    assert await store.next_expiry() == T0 + 5
    clock.advance(5)
    # Not swept yet, but already gone from every read and from the room.
    assert await store.outstanding() == {"h01": Pending(300, 0.0)}
    assert (await store.get_host("h00")).reserved_mb == 0  # type: ignore[union-attr]
    assert await store.next_expiry() == T0 + 50
    again = await store.reserve("h00", memory_mb=1000, owner="r", ttl_s=5)
    assert again is not None
    assert await store.get_reservation(short.id) is None  # ended (folded) by the reserve that needed room
    assert await store.audit() == []
    clock.advance(60)
    assert await store.sweep_expired() == 2
    assert await store.sweep_expired() == 0
    assert await store.outstanding() == {} and await store.next_expiry() is None
    assert await store.confirm(long.id) is False
    assert await store.audit() == []


async def test_drop_owner_ends_only_that_owners_reservations(store: Store) -> None:
    await hosts(store, 3)
    mine = [await store.reserve(h, memory_mb=100, owner="dead", ttl_s=60) for h in ("h00", "h01", "h02")]
    theirs = await store.reserve("h01", memory_mb=200, owner="alive", ttl_s=60)
    assert all(mine) and theirs
    assert await store.drop_owner("dead") == 3
    assert await store.drop_owner("dead") == 0
    assert await store.outstanding() == {"h01": Pending(200, 0.0)}
    assert await store.audit() == []


async def test_reserve_best_takes_the_candidate_with_most_room(store: Store) -> None:
    await hosts(store, 3, admittable=5000)
    # Fill h00 with 3000 and h01 with 1000: by the store's totals h02 has the most room.
    assert await store.reserve("h00", memory_mb=3000, owner="other", ttl_s=60)
    assert await store.reserve("h01", memory_mb=1000, owner="other", ttl_s=60)
    got = await store.reserve_best(["h00", "h01"], memory_mb=500, owner="r", ttl_s=60, sandbox_id="sb")
    assert got is not None and got.host_id == "h01" and got.sandbox_id == "sb"
    got = await store.reserve_best(["h00", "h01", "h02"], memory_mb=500, owner="r", ttl_s=60)
    assert got is not None and got.host_id == "h02"
    # Only a candidate with room qualifies; none left -> None; unknown candidates are ignored.
    assert (await store.reserve_best(["h00", "ghost"], memory_mb=2000, owner="r", ttl_s=60)) is not None
    assert await store.reserve_best(["h00", "ghost"], memory_mb=1, owner="r", ttl_s=60) is None
    assert await store.reserve_best([], memory_mb=1, owner="r", ttl_s=60) is None
    assert await store.audit() == []


async def test_reserve_best_ranks_by_free_fraction_of_memory_and_cpu(store: Store) -> None:
    # A big host half full loses to a small empty one: fractions, not raw MiB.
    await store.upsert_heartbeat(beat("big", 1, admittable=64_000, total=128_000))
    await store.upsert_heartbeat(beat("small", 1, admittable=15_000, total=16_384))
    got = await store.reserve_best(["big", "small"], memory_mb=100, owner="r", ttl_s=60)
    assert got is not None and got.host_id == "small"
    # With memory alike, the host whose CPUs are busier loses (sandboxes measured small still use CPU).
    await store.upsert_heartbeat(beat("busy", 1, admittable=10_000, cpu_used=14.0))
    await store.upsert_heartbeat(beat("idle", 1, admittable=10_000, cpu_used=1.0))
    got = await store.reserve_best(["busy", "idle"], memory_mb=100, owner="r", ttl_s=60)
    assert got is not None and got.host_id == "idle"


async def test_reserve_best_sees_expired_room(store: Store, clock: ManualClock) -> None:
    await hosts(store, 2, admittable=1000)
    assert await store.reserve("h00", memory_mb=1000, owner="r", ttl_s=5)
    assert await store.reserve("h01", memory_mb=1000, owner="r", ttl_s=5)
    assert await store.reserve_best(["h00", "h01"], memory_mb=10, owner="r", ttl_s=5) is None
    clock.advance(5)
    assert await store.reserve_best(["h00", "h01"], memory_mb=1000, owner="r", ttl_s=5) is not None
    assert await store.audit() == []


async def test_reserve_best_ranks_by_live_totals_ending_expired_claims_first(
    store: Store, clock: ManualClock
) -> None:
    await hosts(store, 2, admittable=1000)
    old = await store.reserve("h00", memory_mb=600, owner="r", ttl_s=5)
    assert old is not None
    clock.advance(5)
    assert await store.reserve("h01", memory_mb=300, owner="r", ttl_s=60)
    # By live totals h00 is empty and h01 holds 300: h00 is the roomiest, as the core scores it,
    # although its counter still holds the expired 600 (which alone would have put the pick on h01).
    first = await store.reserve_best(["h00", "h01"], memory_mb=400, owner="r", ttl_s=5)
    assert first is not None and first.host_id == "h00"
    assert await store.get_reservation(old.id) is None
    assert await store.audit() == []


async def test_batch_is_all_or_nothing(store: Store) -> None:
    await hosts(store, 2, admittable=1000)
    items = [
        ReserveItem("h00", 400, 1.0, "a"),
        ReserveItem("h01", 900, 0.0, "b"),
        ReserveItem("h00", 600, 0.25, "c"),
    ]
    got = await store.reserve_batch(items, owner="r", ttl_s=30)
    assert got is not None
    assert [(r.host_id, r.memory_mb, r.cpu, r.sandbox_id) for r in got] == [
        ("h00", 400, 1.0, "a"),
        ("h01", 900, 0.0, "b"),
        ("h00", 600, 0.25, "c"),
    ]
    assert len({r.id for r in got}) == 3 and all(r.expires_at == T0 + 30 for r in got)
    for r in got:
        assert await store.get_reservation(r.id) == r
    assert await store.outstanding() == {"h00": Pending(1000, 1.25), "h01": Pending(900, 0.0)}
    # h00 is full: a batch that fits on h01 but needs 1 MiB on h00 takes nothing anywhere (h01's 100
    # stay free, as the 50 + 50 below show).
    assert (
        await store.reserve_batch([ReserveItem("h01", 100), ReserveItem("h00", 1)], owner="r", ttl_s=30)
        is None
    )
    # Items on one host are summed: 60 + 60 > 100.
    assert (
        await store.reserve_batch([ReserveItem("h01", 60), ReserveItem("h01", 60)], owner="r", ttl_s=30)
        is None
    )
    assert await store.reserve_batch([ReserveItem("h01", 50), ReserveItem("h01", 50)], owner="r", ttl_s=30)
    assert await store.reserve_batch([ReserveItem("ghost", 1)], owner="r", ttl_s=30) is None
    assert await store.reserve_batch([], owner="r", ttl_s=30) == []
    assert await store.outstanding() == {"h00": Pending(1000, 1.25), "h01": Pending(1000, 0.0)}
    assert await store.audit() == []


async def test_batch_reclaims_expired_room(store: Store, clock: ManualClock) -> None:
    await hosts(store, 1, admittable=1000)
    assert await store.reserve("h00", memory_mb=1000, owner="r", ttl_s=5)
    assert await store.reserve_batch([ReserveItem("h00", 500)], owner="r", ttl_s=5) is None
    clock.advance(5)
    assert await store.reserve_batch([ReserveItem("h00", 500), ReserveItem("h00", 500)], owner="r", ttl_s=5)
    assert await store.audit() == []


async def test_bad_reservations_are_refused_before_touching_anything(store: Store) -> None:
    await hosts(store, 1)
    with pytest.raises(InvalidRecord) as e:
        await store.reserve("h00", memory_mb=-1, owner="r", ttl_s=5)
    assert e.value.code == "invalid_request"
    with pytest.raises(InvalidRecord):
        await store.reserve("h00", memory_mb=1, cpu=-0.5, owner="r", ttl_s=5)
    with pytest.raises(InvalidRecord):
        await store.reserve_best(["h00"], memory_mb=1, owner="r", ttl_s=0)
    with pytest.raises(InvalidRecord):
        await store.reserve_batch([ReserveItem("h00", 1), ReserveItem("h00", -1)], owner="r", ttl_s=5)
    assert await store.outstanding() == {}


async def test_concurrent_reservations_in_one_process_never_overbook(store: Store) -> None:
    await hosts(store, 2, admittable=1000)
    got = await asyncio.gather(*(store.reserve("h00", memory_mb=100, owner="r", ttl_s=30) for _ in range(25)))
    assert sum(r is not None for r in got) == 10
    best = await asyncio.gather(
        *(store.reserve_best(["h00", "h01"], memory_mb=100, owner="r", ttl_s=30) for _ in range(25))
    )
    assert sum(r is not None for r in best) == 10
    assert await store.outstanding() == {"h00": Pending(1000, 0.0), "h01": Pending(1000, 0.0)}
    assert await store.audit() == []


async def test_cpu_amounts_add_up_exactly(store: Store) -> None:
    await hosts(store, 1)
    rs = [await store.reserve("h00", memory_mb=1, cpu=0.1, owner="r", ttl_s=30) for _ in range(10)]
    assert (await store.outstanding())["h00"] == Pending(10, 1.0)
    for r in rs:
        assert r is not None and await store.cancel(r.id)
    host = await store.get_host("h00")
    assert host is not None and host.reserved_cpu == 0.0 and host.reserved_mb == 0
