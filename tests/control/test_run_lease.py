"""Run leases and self-fencing on an injected clock: a host cut off from the control plane freezes its
recreate-policy sandboxes when its lease lapses, before any replica may declare it dead and start them
elsewhere; its orphan-policy ones keep running; healed in time it thaws them, healed too late it stops
them (the reply names them), and at dead_after it stops them itself. Sampled at every step: no id runs
(unfrozen) on two hosts."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from corral.agent.protocol import AgentHeartbeat, HeartbeatReply
from corral.core import ConfigError, Timeouts
from corral.core.runlease import LeaseState, RunLease
from corral.core.timeouts import FENCE_BOUND_S

from .conftest import Cluster, make_cluster
from .test_failover import agent, beat_all_but, make, on_one_host


@pytest.fixture
async def small(tmp_path: Path) -> AsyncIterator[Cluster]:
    c = await make_cluster(tmp_path, hosts=4, memory_mb=8192)
    for a in c.fleet.agents:
        a.fence.clock = c.clock.now  # the lease on the test's clock
    try:
        yield c
    finally:
        await c.close()


def running(c: Cluster, sid: str) -> set[str]:
    """Hosts where a copy of ``sid`` runs now: there and not frozen (routable or not)."""
    return {a.id for a in c.fleet.agents if sid in a.sandbox_ids() and not a.runtime.paused(sid)}


async def cut(_: AgentHeartbeat) -> HeartbeatReply:
    raise ConnectionError("cut off")


async def setup(c: Cluster) -> tuple[Any, list[str], list[str]]:
    host, leased = await on_one_host(c, 2, failover="recreate", memory_mb=512)
    orphan: list[str] = []
    while len(orphan) < 1:
        s = await make(c, memory_mb=512)
        if s["host_id"] == host:
            orphan.append(s["id"])
    for a in c.fleet.agents:
        await a.beat()  # every host holds a lease from here
    return agent(c, host), [s["id"] for s in leased], orphan


async def test_a_cut_off_host_freezes_before_its_sandboxes_run_elsewhere(small: Cluster) -> None:
    c = small
    t = c.plane.config.timeouts
    old, leased, orphan = await setup(c)
    sink, old.sink = old.sink, cut
    # Until the lease lapses nothing changes; a beat that fails renews nothing.
    c.clock.advance(t.run_lease - 0.05)
    with pytest.raises(ConnectionError):
        await old.beat()
    assert await old.fence.check() is LeaseState.HELD
    assert all(running(c, sid) == {old.id} for sid in leased + orphan)
    c.clock.advance(0.1)
    assert await old.fence.check() is LeaseState.LAPSED
    assert all(running(c, sid) == set() and old.runtime.paused(sid) for sid in leased)
    assert all(running(c, sid) == {old.id} for sid in orphan)  # never recreated: never fenced
    # Healed before dead_after: the reply renews the lease, nothing moved, everything thaws.
    old.sink = sink
    await old.beat()
    assert all(running(c, sid) == {old.id} for sid in leased + orphan)
    assert old.fence.frozen_total == 2

    # Cut again, now for good: frozen at the lapse, then the others fail it over past dead_after.
    old.sink = cut
    c.clock.advance(t.run_lease + 0.01)
    await old.fence.check()
    assert all(running(c, sid) == set() for sid in leased)
    c.clock.advance(t.dead_after_s - t.run_lease)
    await beat_all_but(c, old.id)
    await c.plane.reconciler.tick()
    for sid in leased:
        rec = await c.plane.store.get_sandbox(sid)
        assert rec is not None and rec.host_id != old.id and rec.epoch == 1
        assert running(c, sid) == {rec.host_id}  # one copy runs, the old one is frozen
    # Healed too late: the reply names them, they are stopped, not thawed.
    old.sink = sink
    await old.beat()
    assert not set(leased) & set(old.sandbox_ids())
    assert all(len(running(c, sid)) == 1 for sid in leased)


async def test_at_dead_after_a_cut_off_host_stops_them_itself(small: Cluster) -> None:
    c = small
    t = c.plane.config.timeouts
    old, leased, orphan = await setup(c)
    old.sink = cut
    c.clock.advance(t.dead_after_s + 0.01)
    assert await old.fence.check() is LeaseState.EXPIRED
    assert not set(leased) & set(old.sandbox_ids()) and old.fence.stopped_total == 2
    assert set(orphan) <= set(old.sandbox_ids())


async def test_a_sandbox_paused_by_its_owner_is_not_thawed_by_the_fence(small: Cluster) -> None:
    c = small
    old, leased, _ = await setup(c)
    await old.pause(leased[0])
    sink, old.sink = old.sink, cut
    c.clock.advance(c.plane.config.timeouts.run_lease + 0.01)
    await old.fence.check()
    old.sink = sink
    await old.beat()
    assert old.runtime.paused(leased[0]) and not old.runtime.paused(leased[1])


def test_a_lease_only_moves_forward_and_lapses_before_dead() -> None:
    lease = RunLease()
    assert lease.state(0.0) is LeaseState.LAPSED  # never granted: what a restarted host adopts stays frozen
    lease.renew(10.0, 5.0, 20.0)
    lease.renew(8.0, 5.0, 20.0)  # a late reply to an older heartbeat
    assert (lease.held_until, lease.dead_at) == (15.0, 30.0)
    assert [lease.state(x) for x in (14.9, 15.0, 29.9, 30.0)] == [
        LeaseState.HELD,
        LeaseState.LAPSED,
        LeaseState.LAPSED,
        LeaseState.EXPIRED,
    ]
    lease.renew(20.0, float("nan"), 20.0)
    assert lease.held_until == 15.0


@pytest.mark.parametrize(
    "timeouts",
    [
        {"run_lease_s": 59.5},  # with the freeze and the clock skew it outlasts dead_after (60)
        {"run_lease_s": 2.0},  # no longer than the heartbeat interval: healthy hosts would freeze
        {"max_clock_skew_s": 5.0, "stale_after_s": 10.0, "dead_after_s": 12.0, "run_lease_s": 10.0},
        {"max_clock_skew_s": -1.0},
    ],
)
def test_a_configuration_where_a_cut_off_host_could_still_run_is_refused(timeouts: dict[str, float]) -> None:
    with pytest.raises(ConfigError):
        Timeouts(**timeouts)


def test_the_default_lease_keeps_the_ordering_with_the_skew_stated() -> None:
    for t in (Timeouts(), Timeouts(heartbeat_interval_s=0.5, stale_after_s=1.5, dead_after_s=3.0)):
        assert t.heartbeat_interval_s < t.run_lease
        assert t.run_lease + FENCE_BOUND_S + t.max_clock_skew_s <= t.dead_after_s


async def test_a_host_back_before_its_sandboxes_moved_is_told_to_stop_them(small: Cluster) -> None:
    """Declared dead, its recreate-policy sandboxes are no longer its own, even before they are placed
    elsewhere: a host that returns in that window stops its copies (else two would run once they are)."""
    c = small
    old, leased, orphan = await setup(c)
    t = c.plane.config.timeouts
    c.clock.advance(t.dead_after_s + 1)
    await beat_all_but(c, old.id)
    await c.plane.store.fail_host(old.id, c.clock.now() - t.dead_after_s)  # step 1 only: nothing placed yet
    for sid in leased:
        rec = await c.plane.store.get_sandbox(sid)
        assert rec is not None and rec.state.value == "recreating" and rec.epoch == 0
    await old.beat()  # it returns: the reply names them, though no other copy runs yet
    assert not set(leased) & set(old.sandbox_ids())
    assert set(orphan) <= set(old.sandbox_ids())  # orphans are reclaimed, as before
    await c.plane.reconciler.tick()
    for sid in leased:
        rec = await c.plane.store.get_sandbox(sid)
        assert rec is not None and rec.state.value == "running" and rec.epoch == 1
        assert len(running(c, sid)) == 1
