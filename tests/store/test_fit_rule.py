"""Each way the store's reservations once differed from the core's filters and score, pinned on both
backends: CPU unchecked, the request's own size and stream restore left out of the ranking, ties broken
by id (SQLite) or at random (PostgreSQL)."""

from __future__ import annotations

from collections import Counter

from corral.core import CreateRequest, Pending, Scorer, host_fits, request_charge_mb, tie_rank
from corral.store import ReserveItem, Store

from .helpers import beat, hosts


async def test_cpu_is_checked_as_the_core_checks_it(store: Store) -> None:
    # One core, overcommitted four times: 4.0 fits, then nothing more, whatever memory is left.
    await store.upsert_heartbeat(beat("c", 1, cpu_total=1.0, cpu_used=0.0))
    view = (await store.get_host("c")).view()  # type: ignore[union-attr]
    assert host_fits(view, Pending(), CreateRequest(memory_mb=1, cpu=4.0))
    assert not host_fits(view, Pending(0, 4.0), CreateRequest(memory_mb=1, cpu=0.125))
    assert await store.reserve("c", memory_mb=1, cpu=4.125, owner="r", ttl_s=60) is None
    assert await store.reserve_best(["c"], memory_mb=1, cpu=4.125, owner="r", ttl_s=60) is None
    assert (
        await store.reserve_batch([ReserveItem("c", 1, 2.0), ReserveItem("c", 1, 2.125)], owner="r", ttl_s=60)
        is None
    )
    assert await store.reserve("c", memory_mb=1, cpu=4.0, owner="r", ttl_s=60) is not None
    assert await store.reserve("c", memory_mb=1, cpu=0.125, owner="r", ttl_s=60) is None
    assert await store.reserve_best(["c"], memory_mb=1, cpu=0.125, owner="r", ttl_s=60) is None
    assert await store.reserve_batch([ReserveItem("c", 1, 0.125)], owner="r", ttl_s=60) is None
    # a request that asks no CPU still fits beside it
    assert await store.reserve("c", memory_mb=1, cpu=0.0, owner="r", ttl_s=60) is not None


async def _store_takes_the_cores_best(store: Store, loser: str, winner: str, req: CreateRequest) -> None:
    """The core scores ``winner`` above ``loser`` for ``req``, and reserve_best offered both takes it."""
    views = {h: (await store.get_host(h)).view() for h in (loser, winner)}  # type: ignore[union-attr]
    assert Scorer().score(views[winner], Pending(), req) > Scorer().score(views[loser], Pending(), req)
    charge = request_charge_mb(req, views[winner].memory_admission)
    got = await store.reserve_best([loser, winner], memory_mb=charge, cpu=req.cpu, owner="r", ttl_s=60)
    assert got is not None and got.host_id == winner


async def test_reserve_best_counts_the_request_against_each_host(store: Store) -> None:
    # Before the request the small host is emptier (1000 of 1000 vs 1990 of 2000); after a 100 MiB
    # charge the large one is (0.945 vs 0.9), and the core scores what is left after the request.
    await store.upsert_heartbeat(beat("small", 1, admittable=1000, total=1000))
    await store.upsert_heartbeat(beat("large", 1, admittable=1990, total=2000))
    await _store_takes_the_cores_best(store, "small", "large", CreateRequest(memory_mb=100, cpu=0.0))


async def test_reserve_best_counts_stream_restore_as_the_core_does(store: Store) -> None:
    await store.upsert_heartbeat(beat("plain", 1, admittable=10_000, total=16_384))
    await store.upsert_heartbeat(beat("stream", 1, admittable=9_800, total=16_384, stream_restore=True))
    await _store_takes_the_cores_best(store, "plain", "stream", CreateRequest(memory_mb=512, cpu=1.0))


async def test_ties_go_by_the_cores_tie_rank_and_spread(store: Store) -> None:
    ids = await hosts(store, 6, admittable=100_000)
    first: Counter[str] = Counter()
    for k in range(60):
        salt = f"sb-{k}"
        expect = min(ids, key=lambda h: tie_rank(salt, h))
        got = await store.reserve_best(ids, memory_mb=1, cpu=0.0, owner="r", ttl_s=60, sandbox_id=salt)
        assert got is not None and got.host_id == expect
        first[got.host_id] += 1
        assert await store.cancel(got.id)  # every host stays equally good
    # the lowest id does not take every tie: each host wins some
    assert set(first) == set(ids), first


async def test_reserve_best_tells_apart_hosts_one_mebibyte_apart(store: Store) -> None:
    # 90,000,001 and 90,000,000 MiB out of 100,000,000 are one number in single precision: ranked in
    # it, the two would tie and the tie-break could pick the emptier-by-one host's neighbour.
    total = 100_000_000
    await store.upsert_heartbeat(beat("a", 1, admittable=90_000_001, total=total))
    await store.upsert_heartbeat(beat("b", 1, admittable=90_000_000, total=total))
    salt = next(s for s in (f"sb-{i}" for i in range(100)) if tie_rank(s, "b") < tie_rank(s, "a"))
    got = await store.reserve_best(["a", "b"], memory_mb=1, cpu=0.0, owner="r", ttl_s=60, sandbox_id=salt)
    assert got is not None and got.host_id == "a"
