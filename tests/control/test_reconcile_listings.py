"""The reconciler finds lost sandboxes and strays from what hosts' listings changed, not by reading
every record: what never reached a listing is still found, and a quiet fleet leaves nothing to check."""

from __future__ import annotations

from corral.agent.protocol import StartSandbox
from corral.store import SandboxState

from .conftest import ADMIN, Cluster


async def _create(c: Cluster) -> dict[str, str]:
    r = await c.http.post("/v1/sandboxes", json={"memory_mb": 256}, headers=c.as_(ADMIN))
    assert r.status_code == 201, r.text
    return dict(r.json())


async def sweeps(c: Cluster, n: int) -> None:
    for _ in range(n):
        c.clock.advance(0.5)
        await c.beat()
        await c.plane.reconciler._stop_strays()


async def test_a_sandbox_that_died_before_any_heartbeat_listed_it_is_marked_stopped(cluster: Cluster) -> None:
    c = cluster
    await c.beat()
    await sweeps(c, 2)  # settled: every listing acknowledged, nothing under watch
    sb = await _create(c)
    agent = next(a for a in c.fleet.agents if a.id == sb["host_id"])
    await agent.runtime.stop(sb["id"])  # dies before the host's next heartbeat
    await agent.measure()
    assert sb["id"] not in agent.sandbox_ids()
    await sweeps(c, 3)
    rec = await c.plane.store.get_sandbox(sb["id"])
    assert rec is not None and rec.state is SandboxState.STOPPED


async def test_a_quiet_fleet_leaves_nothing_to_check_and_a_change_is_checked(cluster: Cluster) -> None:
    c = cluster
    sb = await _create(c)
    await sweeps(c, 3)
    rec = await c.plane.store.get_sandbox(sb["id"])
    assert rec is not None and rec.state is SandboxState.RUNNING  # listed where its record says
    assert c.plane.reconciler._watch == set()
    c.clock.advance(60)  # beyond the overlap: the sweep reads only what changed since the last one
    await sweeps(c, 1)
    assert c.plane.reconciler._watch == set()
    stray = c.fleet.agents[0]
    await stray.start(StartSandbox(id="sb-nobodys", memory_mb=256))
    await sweeps(c, 1)
    assert c.plane.reconciler._watch == {(stray.id, "sb-nobodys")}  # seen once: not yet stopped
    assert "sb-nobodys" in stray.sandbox_ids()
    await sweeps(c, 2)
    assert "sb-nobodys" not in stray.sandbox_ids()
    assert c.plane.reconciler._watch == set()
