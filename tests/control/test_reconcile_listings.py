"""The reconciler finds lost sandboxes and strays from what hosts' listings changed, not by reading
every record: what never reached a listing is still found, a quiet fleet leaves nothing to check, and
what a sweep failed to act on (the store or the agent unreachable) is acted on by a later one although
its listing entry never changes again."""

from __future__ import annotations

from typing import Any

from corral.agent.errors import AgentUnavailable
from corral.agent.protocol import StartSandbox
from corral.store import SandboxState, StoreUnavailable

from .conftest import ADMIN, Cluster


async def _create(c: Cluster) -> dict[str, str]:
    r = await c.http.post("/v1/sandboxes", json={"memory_mb": 256}, headers=c.as_(ADMIN))
    assert r.status_code == 201, r.text
    return dict(r.json())


class Cut:
    """Whatever it wraps, with the named calls failing as ``error`` while ``down``."""

    def __init__(self, inner: Any, calls: set[str], error: Exception) -> None:
        self.inner, self.calls, self.error = inner, calls, error
        self.down = True
        self.refused = 0

    def __getattr__(self, name: str) -> Any:
        fn = getattr(self.inner, name)
        if name not in self.calls:
            return fn

        async def call(*args: Any, **kwargs: Any) -> Any:
            if self.down:
                self.refused += 1
                raise self.error
            return await fn(*args, **kwargs)

        return call


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


async def test_a_lost_sandbox_the_store_could_not_mark_is_marked_by_a_later_sweep(cluster: Cluster) -> None:
    c = cluster
    rec = c.plane.reconciler
    sb = await _create(c)
    await sweeps(c, 2)
    agent = next(a for a in c.fleet.agents if a.id == sb["host_id"])
    await agent.runtime.stop(sb["id"])  # dies with nothing but its host's listing to tell
    await agent.measure()
    store = rec.store
    cut = Cut(store, {"set_sandbox_state"}, StoreUnavailable("the store cannot be reached"))
    rec.store = cut  # type: ignore[assignment]
    await sweeps(c, 1)  # seen lost once
    # Past the listings' overlap: no sweep after this one reads its (unchanged) entry again.
    c.clock.advance(60)
    await sweeps(c, 1)  # seen lost twice: the write that marks it fails
    assert cut.refused == 1
    cut.down = False
    await sweeps(c, 2)
    got = await store.get_sandbox(sb["id"])
    assert got is not None and got.state is SandboxState.STOPPED
    assert rec._watch == set()


async def test_a_stray_its_agent_could_not_stop_is_stopped_by_a_later_sweep(cluster: Cluster) -> None:
    c = cluster
    rec = c.plane.reconciler
    await sweeps(c, 2)
    host = c.fleet.agents[0]
    await host.start(StartSandbox(id="sb-nobodys", memory_mb=256))
    agents = rec.agents
    unreachable = AgentUnavailable(message="the host cannot be reached")

    class CutAgents:
        def client(self, host_id: str, address: str) -> Any:
            return Cut(agents.client(host_id, address), {"stop"}, unreachable)

    rec.agents = CutAgents()  # type: ignore[assignment]
    await sweeps(c, 1)  # seen once
    c.clock.advance(60)  # past the listings' overlap, as above
    await sweeps(c, 1)  # seen twice: the stop fails
    assert "sb-nobodys" in host.sandbox_ids()
    rec.agents = agents
    await sweeps(c, 2)
    assert "sb-nobodys" not in host.sandbox_ids()
    assert rec._watch == set()
