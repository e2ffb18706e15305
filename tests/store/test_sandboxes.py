"""Sandboxes: one transaction for idempotency, name uniqueness and quota; compare-and-set state
changes; tenant-scoped reads; stable keyset pagination."""

from __future__ import annotations

import asyncio
import secrets

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from corral.core import ManualClock
from corral.store import (
    IdempotencyMismatch,
    InvalidRecord,
    NameConflict,
    QuotaExceeded,
    RecordNotFound,
    SandboxRecord,
    SandboxState,
    StateConflict,
    Store,
    TenantRecord,
    Usage,
    open_store,
)

from .conftest import T0
from .helpers import sandbox


@pytest.fixture
async def tenant(store: Store) -> TenantRecord:
    return await store.create_tenant("acme", max_sandboxes=5, max_memory_mb=4096)


async def test_create_sets_times_and_version(store: Store, tenant: TenantRecord, clock: ManualClock) -> None:
    rec = SandboxRecord(
        id="sb-1",
        tenant_id=tenant.id,
        template="default",
        memory_mb=512,
        cpus=1.5,
        name="web",
        stateful=True,
        metadata={"team": "infra"},
        expires_at=T0 + 300,
    )
    out = await store.create_sandbox(rec)
    assert not out.replayed
    got = await store.get_sandbox("sb-1")
    assert got == out.record
    assert got is not None
    assert (got.created_at, got.updated_at, got.version, got.state) == (T0, T0, 1, SandboxState.RESERVED)
    assert (got.name, got.stateful, dict(got.metadata), got.expires_at, got.cpus) == (
        "web",
        True,
        {"team": "infra"},
        T0 + 300,
        1.5,
    )


async def test_idempotency_key_returns_the_first_result(store: Store, tenant: TenantRecord) -> None:
    first = await store.create_sandbox(sandbox("sb-1", tenant), idempotency_key="k1", request_hash="h")
    again = await store.create_sandbox(sandbox("sb-2", tenant), idempotency_key="k1", request_hash="h")
    assert again.replayed and again.record == first.record
    assert await store.get_sandbox("sb-2") is None
    with pytest.raises(IdempotencyMismatch) as e:
        await store.create_sandbox(sandbox("sb-3", tenant), idempotency_key="k1", request_hash="other")
    assert e.value.code == "idempotency_key_reused"
    # Keys are per tenant: another tenant's identical key is its own.
    other = await store.create_tenant("other", max_sandboxes=5, max_memory_mb=4096)
    theirs = await store.create_sandbox(sandbox("sb-4", other), idempotency_key="k1", request_hash="h")
    assert not theirs.replayed and theirs.record.id == "sb-4"
    # The replay answers with the current record, and still answers after the sandbox is gone.
    await store.set_sandbox_state("sb-1", SandboxState.RUNNING, host_id="h1")
    assert (
        await store.create_sandbox(sandbox("x", tenant), idempotency_key="k1")
    ).record.state is SandboxState.RUNNING
    await store.delete_sandbox("sb-1")
    gone = await store.create_sandbox(sandbox("x", tenant), idempotency_key="k1", request_hash="h")
    assert gone.replayed and gone.record.id == "sb-1"


async def test_idempotency_keys_can_be_purged(store: Store, tenant: TenantRecord, clock: ManualClock) -> None:
    await store.create_sandbox(sandbox("sb-1", tenant), idempotency_key="old")
    clock.advance(100)
    await store.create_sandbox(sandbox("sb-2", tenant), idempotency_key="new")
    assert await store.purge_idempotency_keys(T0 + 50) == 1
    # The old key is forgotten (a retry creates anew); the new one still replays.
    assert not (await store.create_sandbox(sandbox("sb-3", tenant), idempotency_key="old")).replayed
    assert (await store.create_sandbox(sandbox("sb-4", tenant), idempotency_key="new")).record.id == "sb-2"


async def test_concurrent_creates_with_one_key_make_one_sandbox(store: Store, tenant: TenantRecord) -> None:
    outs = await asyncio.gather(
        *(
            store.create_sandbox(sandbox(f"sb-{i}", tenant), idempotency_key="same", request_hash="h")
            for i in range(5)
        )
    )
    assert sum(not o.replayed for o in outs) == 1
    assert len({o.record.id for o in outs}) == 1
    assert (await store.usage(tenant.id)).sandboxes == 1


async def test_names_are_unique_per_tenant_among_undeleted(store: Store, tenant: TenantRecord) -> None:
    await store.create_sandbox(sandbox("sb-1", tenant, name="web"))
    with pytest.raises(NameConflict) as e:
        await store.create_sandbox(sandbox("sb-2", tenant, name="web"))
    assert e.value.code == "name_conflict"
    other = await store.create_tenant("other", max_sandboxes=5, max_memory_mb=4096)
    await store.create_sandbox(sandbox("sb-3", other, name="web"))
    # Unnamed sandboxes never collide; a reused id is refused too.
    await store.create_sandbox(sandbox("sb-4", tenant))
    await store.create_sandbox(sandbox("sb-5", tenant))
    with pytest.raises(NameConflict):
        await store.create_sandbox(sandbox("sb-4", tenant))
    # Once deleted (state or row), the name is free again.
    await store.set_sandbox_state("sb-1", SandboxState.DELETED)
    await store.create_sandbox(sandbox("sb-6", tenant, name="web"))
    # ... and the deleted one cannot come back under the taken name.
    with pytest.raises(NameConflict):
        await store.set_sandbox_state("sb-1", SandboxState.RUNNING)
    await store.delete_sandbox("sb-6")
    await store.create_sandbox(sandbox("sb-7", tenant, name="web"))


async def test_quota_counts_live_sandboxes_and_memory(store: Store) -> None:
    t = await store.create_tenant("small", max_sandboxes=3, max_memory_mb=2048)
    await store.create_sandbox(sandbox("a", t, memory_mb=1024))
    await store.create_sandbox(sandbox("b", t, memory_mb=512))
    with pytest.raises(QuotaExceeded) as e:
        await store.create_sandbox(sandbox("c", t, memory_mb=1024))
    assert (e.value.code, e.value.limit, e.value.allowed, e.value.used, e.value.requested) == (
        "tenant_over_quota",
        "max_memory_mb",
        2048,
        1536,
        1024,
    )
    await store.create_sandbox(sandbox("c", t, memory_mb=512))
    with pytest.raises(QuotaExceeded) as e:
        await store.create_sandbox(sandbox("d", t, memory_mb=1))
    assert e.value.limit == "max_sandboxes"
    assert (await store.usage(t.id)).sandboxes == 3
    # Stopped, failed and deleted sandboxes hold no quota.
    await store.set_sandbox_state("a", SandboxState.STOPPED)
    assert await store.usage(t.id) == Usage(2, 1024, 2.0)
    await store.create_sandbox(sandbox("d", t, memory_mb=1024))
    # A quota change applies to the next create.
    await store.set_quota(t.id, max_sandboxes=10, max_memory_mb=10_000)
    await store.create_sandbox(sandbox("e", t, memory_mb=4096))
    with pytest.raises(RecordNotFound):
        await store.create_sandbox(sandbox("f", TenantRecord("tn_ghost", "ghost", 1, 1, 0.0)))


async def test_quota_counts_cpus_and_names_max_cpus(store: Store) -> None:
    t = await store.create_tenant("cpu", max_sandboxes=10, max_memory_mb=100_000, max_cpus=2.5)
    assert t.max_cpus == 2.5 and await store.get_tenant(t.id) == t
    await store.create_sandbox(sandbox("a", t, cpus=1.25))
    await store.create_sandbox(sandbox("b", t, cpus=1.0), idempotency_key="kb")
    for key in (None, "kc"):  # both create paths: the one conditional UPDATE, and the full checks
        with pytest.raises(QuotaExceeded) as e:
            await store.create_sandbox(sandbox("c", t, cpus=0.5), idempotency_key=key)
        assert (e.value.limit, e.value.allowed, e.value.used, e.value.requested) == (
            "max_cpus",
            2.5,
            2.25,
            0.5,
        )
    # A record that holds no quota is not counted against it.
    await store.create_sandbox(sandbox("s", t, cpus=100.0, state=SandboxState.STOPPED))
    await store.create_sandbox(sandbox("c", t, cpus=0.25))
    assert await store.usage(t.id) == Usage(3, 1536, 2.5)
    await store.delete_sandbox("a")
    assert await store.usage(t.id) == Usage(2, 1024, 1.25)
    raised = await store.set_quota(t.id, max_sandboxes=10, max_memory_mb=100_000, max_cpus=8)
    assert raised.max_cpus == 8.0
    kept = await store.set_quota(t.id, max_sandboxes=11, max_memory_mb=100_000)
    assert (kept.max_sandboxes, kept.max_cpus) == (11, 8.0)
    await store.create_sandbox(sandbox("d", t, cpus=6.75))
    assert (await store.usage(t.id)).cpus == 8.0
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(InvalidRecord):
            await store.set_quota(t.id, max_sandboxes=1, max_memory_mb=1, max_cpus=bad)
        with pytest.raises(InvalidRecord):
            await store.create_tenant(f"bad{bad}", max_sandboxes=1, max_memory_mb=1, max_cpus=bad)
    assert await store.audit() == []


async def test_creates_racing_across_replicas_never_exceed_the_cpu_quota(
    store: Store, store_url: str
) -> None:
    """Two replicas (two stores on one database) race 24 creates of 1.5 CPUs, half with an
    Idempotency-Key, for a quota of 10 CPUs: exactly six are made."""
    other = open_store(store_url, clock=ManualClock(T0))
    try:
        t = await store.create_tenant("racing", max_sandboxes=100, max_memory_mb=100_000, max_cpus=10)

        async def one(i: int) -> bool:
            s = store if i % 2 else other
            try:
                await s.create_sandbox(
                    sandbox(f"sb-{i}", t, cpus=1.5), idempotency_key=f"k{i}" if i % 4 < 2 else None
                )
                return True
            except QuotaExceeded as e:
                assert e.limit == "max_cpus"
                return False

        made = await asyncio.gather(*(one(i) for i in range(24)))
        assert sum(made) == 6
        assert await store.usage(t.id) == Usage(6, 6 * 512, 9.0)
        assert await store.audit() == []
    finally:
        await other.close()


async def test_concurrent_creates_never_exceed_quota(store: Store) -> None:
    t = await store.create_tenant("burst", max_sandboxes=4, max_memory_mb=100_000)

    async def one(i: int) -> bool:
        try:
            await store.create_sandbox(sandbox(f"sb-{i}", t))
            return True
        except QuotaExceeded:
            return False

    made = await asyncio.gather(*(one(i) for i in range(12)))
    assert sum(made) == 4 and (await store.usage(t.id)).sandboxes == 4


async def test_state_changes_are_compare_and_set(
    store: Store, tenant: TenantRecord, clock: ManualClock
) -> None:
    await store.create_sandbox(sandbox("sb-1", tenant))
    clock.advance(1)
    starting = await store.set_sandbox_state(
        "sb-1", SandboxState.STARTING, expect=SandboxState.RESERVED, host_id="h1", reservation_id="r1"
    )
    assert (starting.state, starting.host_id, starting.reservation_id, starting.version) == (
        SandboxState.STARTING,
        "h1",
        "r1",
        2,
    )
    assert starting.updated_at == T0 + 1 and starting.created_at == T0
    with pytest.raises(StateConflict) as e:
        await store.set_sandbox_state("sb-1", SandboxState.RUNNING, expect=SandboxState.RESERVED)
    assert (
        e.value.current is SandboxState.STARTING and e.value.version == 2 and e.value.code == "state_conflict"
    )
    with pytest.raises(StateConflict):
        await store.set_sandbox_state("sb-1", SandboxState.RUNNING, expect_version=1)
    running = await store.set_sandbox_state(
        "sb-1", SandboxState.RUNNING, expect={SandboxState.STARTING, SandboxState.RESERVED}, expect_version=2
    )
    # host_id and reservation_id are kept unless given; None clears.
    assert (running.host_id, running.reservation_id, running.version) == ("h1", "r1", 3)
    cleared = await store.set_sandbox_state("sb-1", SandboxState.ORPHANED, reservation_id=None)
    assert cleared.reservation_id is None and cleared.host_id == "h1"
    with pytest.raises(RecordNotFound):
        await store.set_sandbox_state("nope", SandboxState.RUNNING)
    with pytest.raises(InvalidRecord):
        await store.set_sandbox_state("sb-1", "bogus")  # type: ignore[arg-type]


async def test_two_deciders_cannot_both_claim(store: Store, tenant: TenantRecord) -> None:
    await store.create_sandbox(sandbox("sb-1", tenant, state=SandboxState.ORPHANED))

    async def claim(host: str) -> str | None:
        try:
            await store.set_sandbox_state(
                "sb-1", SandboxState.RUNNING, expect=SandboxState.ORPHANED, host_id=host
            )
            return host
        except StateConflict:
            return None

    won = [h for h in await asyncio.gather(*(claim(f"h{i}") for i in range(6))) if h]
    assert len(won) == 1
    assert (await store.get_sandbox("sb-1")).host_id == won[0]  # type: ignore[union-attr]


async def test_tenant_scoped_reads(store: Store, tenant: TenantRecord) -> None:
    other = await store.create_tenant("other", max_sandboxes=5, max_memory_mb=4096)
    await store.create_sandbox(sandbox("sb-1", tenant))
    assert await store.get_sandbox("sb-1", tenant_id=tenant.id) is not None
    assert await store.get_sandbox("sb-1", tenant_id=other.id) is None
    assert await store.get_sandbox("sb-1") is not None  # the admin view
    assert (await store.list_sandboxes(tenant_id=other.id)).items == []


async def test_expiry_and_the_reaper_query(store: Store, tenant: TenantRecord, clock: ManualClock) -> None:
    await store.create_sandbox(sandbox("a", tenant, expires_at=T0 + 10))
    await store.create_sandbox(sandbox("b", tenant, expires_at=T0 + 5))
    await store.create_sandbox(sandbox("c", tenant))
    await store.create_sandbox(sandbox("d", tenant, expires_at=T0 + 1, state=SandboxState.STOPPED))
    assert await store.expired_sandboxes() == []
    clock.advance(10)
    assert [s.id for s in await store.expired_sandboxes()] == ["b", "a"]
    assert [s.id for s in await store.expired_sandboxes(T0 + 7)] == ["b"]
    assert [s.id for s in await store.expired_sandboxes(limit=1)] == ["b"]
    extended = await store.set_sandbox_expiry("a", T0 + 100)
    assert extended.expires_at == T0 + 100 and extended.version == 2
    assert await store.set_sandbox_expiry("c", None)
    assert [s.id for s in await store.expired_sandboxes()] == ["b"]
    with pytest.raises(RecordNotFound):
        await store.set_sandbox_expiry("zz", None)


async def test_delete(store: Store, tenant: TenantRecord) -> None:
    await store.create_sandbox(sandbox("sb-1", tenant))
    assert await store.delete_sandbox("sb-1") is True
    assert await store.delete_sandbox("sb-1") is False
    assert await store.get_sandbox("sb-1") is None


async def test_invalid_records_are_refused(store: Store, tenant: TenantRecord) -> None:
    for bad in (
        sandbox("", tenant),
        sandbox("x", tenant, memory_mb=0),
        sandbox("x", tenant, name=""),
        SandboxRecord("x", "", "default", 512, 1.0),
        SandboxRecord("x", tenant.id, "default", 512, -1.0),
    ):
        with pytest.raises(InvalidRecord):
            await store.create_sandbox(bad)
    assert (await store.usage(tenant.id)).sandboxes == 0
    for kwargs in ({"limit": 0}, {"limit": 1001}, {"cursor": "not-a-cursor"}, {"cursor": "WzEsMl0"}):
        with pytest.raises(InvalidRecord):
            await store.list_sandboxes(**kwargs)  # type: ignore[arg-type]


async def test_list_filters(store: Store, tenant: TenantRecord) -> None:
    await store.create_sandbox(sandbox("a", tenant, host_id="h1", state=SandboxState.RUNNING))
    await store.create_sandbox(sandbox("b", tenant, host_id="h2", state=SandboxState.RUNNING))
    await store.create_sandbox(sandbox("c", tenant, host_id="h1", state=SandboxState.ORPHANED))
    assert [s.id for s in (await store.list_sandboxes(host_id="h1")).items] == ["a", "c"]
    assert [s.id for s in (await store.list_sandboxes(state=SandboxState.RUNNING)).items] == ["a", "b"]
    both = await store.list_sandboxes(state=[SandboxState.ORPHANED, SandboxState.RUNNING], host_id="h1")
    assert [s.id for s in both.items] == ["a", "c"] and both.next_cursor is None


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    n=st.integers(min_value=0, max_value=23),
    limit=st.integers(min_value=1, max_value=7),
    ticks=st.lists(st.sampled_from([0.0, 0.0, 0.5, 1.0]), min_size=23, max_size=23),
    deleted=st.sets(st.integers(min_value=0, max_value=22), max_size=5),
    newest_first=st.booleans(),
)
async def test_pagination_visits_everything_once_in_order(
    store: Store,
    clock: ManualClock,
    n: int,
    limit: int,
    ticks: list[float],
    deleted: set[int],
    newest_first: bool,
) -> None:
    # Each example gets a fresh tenant in the same store, so ids and names never clash across examples.
    tenant = await store.create_tenant(f"t-{secrets.token_hex(6)}", max_sandboxes=100, max_memory_mb=10**6)
    made = []
    for i in range(n):
        clock.advance(ticks[i])  # several creates share one timestamp: the id breaks the tie
        rec = (await store.create_sandbox(sandbox(f"{tenant.id}-{(i * 7) % 23:02d}-{i}", tenant))).record
        made.append(rec)
    pages = []
    cursor: str | None = None
    while True:
        page = await store.list_sandboxes(
            tenant_id=tenant.id, limit=limit, cursor=cursor, newest_first=newest_first
        )
        pages.append(page.items)
        assert len(page.items) <= limit
        if page.next_cursor is None:
            break
        # Rows deleted behind the cursor must not shift what comes next.
        for i in deleted:
            if i < len(made):
                await store.delete_sandbox(made[i].id)
        cursor = page.next_cursor
    seen = [s.id for p in pages for s in p]
    expected = [s.id for s in sorted(made, key=lambda s: (s.created_at, s.id), reverse=newest_first)]
    assert len(seen) == len(set(seen))
    # Everything not deleted is seen, in order; deleted rows may or may not have been seen already.
    survivors = [i for i in expected if i not in {made[j].id for j in deleted if j < len(made)}]
    assert [i for i in seen if i in survivors] == survivors
    assert seen == [i for i in expected if i in seen]


async def test_summaries_are_the_records_fields_paged_after_a_position(
    store: Store, tenant: TenantRecord, clock: ManualClock
) -> None:
    other = await store.create_tenant("other", max_sandboxes=5, max_memory_mb=4096)
    await store.create_sandbox(sandbox("s2", tenant, name="web", metadata={"team": "a"}, host_id="h1"))
    await store.create_sandbox(sandbox("s1", tenant, warm=True))  # same instant: the id orders them
    clock.advance(1)
    await store.create_sandbox(sandbox("s3", other))
    await store.create_sandbox(sandbox("s4", tenant))
    await store.set_sandbox_state("s4", SandboxState.DELETED)
    mine = await store.list_sandbox_summaries(tenant_id=tenant.id)
    assert [s.id for s in mine] == ["s1", "s2"]  # another tenant's and the deleted are not listed
    for s in mine:
        rec = await store.get_sandbox(s.id)
        assert rec is not None
        assert s == (
            rec.id,
            rec.tenant_id,
            rec.name,
            rec.template,
            rec.host_id,
            rec.state,
            dict(rec.metadata),
            rec.created_at,
            rec.warm,
        )
    assert [s.id for s in await store.list_sandbox_summaries()] == ["s1", "s2", "s3"]
    assert [s.id for s in await store.list_sandbox_summaries(after=mine[0].position)] == ["s2", "s3"]
    assert [s.id for s in await store.list_sandbox_summaries(limit=1, after=mine[0].position)] == ["s2"]
    # A create after the position is listed after it; a delete before it moves nothing.
    await store.delete_sandbox("s1")
    clock.advance(1)
    await store.create_sandbox(sandbox("s0", tenant))
    assert [s.id for s in await store.list_sandbox_summaries(after=mine[0].position)] == ["s2", "s3", "s0"]
    for bad in (0, 10_001):
        with pytest.raises(InvalidRecord):
            await store.list_sandbox_summaries(limit=bad)


async def test_oom_kills_follow_their_host_and_never_go_down(store: Store) -> None:
    tenant = await store.create_tenant("ooms", max_sandboxes=10, max_memory_mb=10_000)
    await store.create_sandbox(sandbox("sb-oom", tenant, host_id="h1"))
    await store.create_sandbox(sandbox("sb-calm", tenant, host_id="h1"))
    assert (await store.get_sandbox("sb-oom")).oom_kills == 0
    await store.record_oom_kills("h1", {"sb-oom": 3})
    # A late or repeated heartbeat with an older count, or another host naming it, changes nothing.
    await store.record_oom_kills("h1", {"sb-oom": 2})
    await store.record_oom_kills("h2", {"sb-oom": 9, "sb-calm": 9})
    await store.record_oom_kills("h1", {"sb-unknown": 1})
    assert (await store.get_sandbox("sb-oom")).oom_kills == 3
    assert (await store.get_sandbox("sb-calm")).oom_kills == 0


async def test_a_delete_that_expects_a_state_leaves_a_record_that_moved(
    store: Store, tenant: TenantRecord
) -> None:
    await store.create_sandbox(sandbox("sb-1", tenant), idempotency_key="k1", request_hash="h")
    await store.create_sandbox(sandbox("sb-2", tenant), idempotency_key="k2", request_hash="h")
    await store.set_sandbox_state("sb-1", SandboxState.RUNNING, host_id="h1")
    # Placed meanwhile: the record stays, counted, and its key still answers with it.
    assert not await store.delete_sandbox("sb-1", forget_idempotency=True, expect=SandboxState.RESERVED)
    assert (await store.get_sandbox("sb-1")).state is SandboxState.RUNNING  # type: ignore[union-attr]
    again = await store.create_sandbox(sandbox("x", tenant), idempotency_key="k1", request_hash="h")
    assert again.replayed and again.record.id == "sb-1"
    # Still as expected: it goes, its key with it, and the same key then creates anew.
    assert await store.delete_sandbox("sb-2", forget_idempotency=True, expect=SandboxState.RESERVED)
    assert (await store.usage(tenant.id)).sandboxes == 1
    anew = await store.create_sandbox(sandbox("sb-3", tenant), idempotency_key="k2", request_hash="h")
    assert not anew.replayed and anew.record.id == "sb-3"
    assert not await store.delete_sandbox("sb-2", expect=SandboxState.RESERVED)


async def test_placements_are_read_for_many_sandboxes_at_once(either: Store) -> None:
    store = either
    owner = await store.create_tenant("many", max_sandboxes=10, max_memory_mb=1 << 20)
    for sid in ("sb-a", "sb-b", "sb-c"):
        await store.create_sandbox(sandbox(sid, owner))
    await store.set_sandbox_state("sb-a", SandboxState.STARTING, host_id="h1", placement='{"host": "h1"}')
    got = await store.get_placements(["sb-a", "sb-b", "sb-gone"])
    # The gone one is absent; one with no explanation kept is None.
    assert got == {"sb-a": '{"host": "h1"}', "sb-b": None}
    assert got["sb-a"] == await store.get_placement("sb-a")
    assert await store.get_placements([]) == {}
