"""Hosts: heartbeats register and refresh, delayed ones are ignored, drain survives them, and a
heartbeat that shows a sandbox confirms its reservation in the same transaction."""

from __future__ import annotations

import pytest

from corral.core import AdmissionMode, HostState, HostView, ManualClock, Pending
from corral.store import RecordNotFound, Store

from .conftest import T0
from .helpers import beat


async def test_heartbeat_registers_a_host_with_every_field(store: Store, clock: ManualClock) -> None:
    hb = beat(
        "h1",
        7,
        templates=frozenset({"py", "node"}),
        runtime="process",
        gpu="a10",
        role="worker",
        stream_restore=True,
        address="http://10.0.0.1:7000",
        sandbox_ids=frozenset({"sb-a"}),
    )
    result = await store.upsert_heartbeat(hb)
    assert result.accepted and result.confirmed == 0
    host = await store.get_host("h1")
    assert host is not None and host == result.host
    assert (host.seq, host.heartbeat_at, host.registered_at) == (7, T0, T0)
    assert host.templates == frozenset({"py", "node"})
    assert (host.runtime, host.gpu, host.stream_restore, host.address) == (
        "process",
        "a10",
        True,
        "http://10.0.0.1:7000",
    )
    assert host.sandbox_count == 1 and host.listed_seq == 7 and host.listed_at == T0
    assert await store.listed("h1", ["sb-a", "sb-b"]) == {"sb-a": 0}
    assert host.state is HostState.READY and host.memory_admission is AdmissionMode.WORKING_SET
    assert (host.reserved_mb, host.reserved_cpu) == (0, 0.0)
    view = host.view()
    assert isinstance(view, HostView)
    assert (view.id, view.memory_mb_admittable, view.heartbeat_at, view.templates) == (
        "h1",
        10_000,
        T0,
        frozenset({"py", "node"}),
    )
    assert host.pending() == Pending(0, 0.0)


async def test_templates_none_means_any(store: Store) -> None:
    await store.upsert_heartbeat(beat("h1", 1))
    host = await store.get_host("h1")
    assert host is not None and host.templates is None


async def test_newer_heartbeat_refreshes_and_older_is_ignored(store: Store, clock: ManualClock) -> None:
    await store.upsert_heartbeat(beat("h1", 5, admittable=8000))
    clock.advance(2)
    fresh = await store.upsert_heartbeat(beat("h1", 6, admittable=6000))
    assert fresh.accepted and fresh.host.memory_mb_admittable == 6000 and fresh.host.heartbeat_at == T0 + 2
    clock.advance(2)
    # A delayed packet (seq 4) and a duplicate (seq 6) must not roll the host back.
    for seq in (4, 6):
        late = await store.upsert_heartbeat(beat("h1", seq, admittable=9999))
        assert not late.accepted
        assert (
            late.host.memory_mb_admittable == 6000 and late.host.seq == 6 and late.host.heartbeat_at == T0 + 2
        )
    assert (await store.get_host("h1")).memory_mb_admittable == 6000  # type: ignore[union-attr]
    # A registration keeps the first time it saw the host.
    assert fresh.host.registered_at == T0


async def test_drain_survives_heartbeats_and_undrain_restores(store: Store) -> None:
    await store.upsert_heartbeat(beat("h1", 1))
    drained = await store.drain("h1")
    assert drained.state is HostState.DRAINING
    after = await store.upsert_heartbeat(beat("h1", 2))
    assert after.accepted and after.host.state is HostState.DRAINING
    assert (await store.undrain("h1")).state is HostState.READY
    with pytest.raises(RecordNotFound):
        await store.drain("nope")
    with pytest.raises(RecordNotFound):
        await store.undrain("nope")


async def test_heartbeat_confirms_reservations_of_the_sandboxes_it_shows(store: Store) -> None:
    await store.upsert_heartbeat(beat("h1", 1, admittable=10_000))
    await store.upsert_heartbeat(beat("h2", 1, admittable=10_000))
    a = await store.reserve("h1", memory_mb=1000, cpu=1.5, owner="r", ttl_s=60, sandbox_id="sb-a")
    b = await store.reserve("h1", memory_mb=2000, owner="r", ttl_s=60, sandbox_id="sb-b")
    other = await store.reserve("h2", memory_mb=500, owner="r", ttl_s=60, sandbox_id="sb-a")
    assert a and b and other
    # The agent now accounts for sb-a: its admittable dropped and the reservation must stop counting.
    result = await store.upsert_heartbeat(
        beat("h1", 2, admittable=9000, sandbox_ids=frozenset({"sb-a", "sb-x"}))
    )
    assert result.accepted and result.confirmed == 1
    assert (result.host.reserved_mb, result.host.reserved_cpu) == (2000, 0.0)
    assert await store.get_reservation(a.id) is None
    assert await store.confirm(a.id) is False  # it ended exactly once, by the heartbeat
    # Only reservations on *that* host: the same sandbox id elsewhere is untouched.
    assert await store.get_reservation(other.id) is not None
    assert await store.audit() == []


async def test_a_delayed_heartbeat_confirms_nothing(store: Store) -> None:
    await store.upsert_heartbeat(beat("h1", 5))
    r = await store.reserve("h1", memory_mb=1000, owner="r", ttl_s=60, sandbox_id="sb-a")
    assert r is not None
    late = await store.upsert_heartbeat(beat("h1", 4, sandbox_ids=frozenset({"sb-a"})))
    assert not late.accepted and late.confirmed == 0
    assert await store.get_reservation(r.id) is not None


async def test_register_before_first_heartbeat_is_stale_and_empty(store: Store) -> None:
    host = await store.register_host("h9", address="http://a:1")
    assert host.heartbeat_at == 0.0 and host.memory_mb_admittable == 0 and host.seq == -1
    assert await store.reserve("h9", memory_mb=1, owner="r", ttl_s=5) is None
    # The first heartbeat (any seq >= 0) is accepted; an empty address keeps the registered one.
    first = await store.upsert_heartbeat(beat("h9", 0))
    assert first.accepted and first.host.address == "http://a:1"
    again = await store.register_host("h9", address="http://b:2")
    assert again.address == "http://b:2" and again.memory_mb_admittable == 10_000


async def test_list_hosts_is_ordered_and_delete_ends_reservations(store: Store) -> None:
    for h in ("h3", "h1", "h2"):
        await store.upsert_heartbeat(beat(h, 1))
    assert [h.id for h in await store.list_hosts()] == ["h1", "h2", "h3"]
    r = await store.reserve("h2", memory_mb=100, owner="r", ttl_s=60)
    assert r is not None
    assert await store.delete_host("h2") is True
    assert await store.delete_host("h2") is False
    assert await store.get_host("h2") is None
    assert await store.get_reservation(r.id) is None
    assert await store.outstanding() == {}
    assert await store.audit() == []
