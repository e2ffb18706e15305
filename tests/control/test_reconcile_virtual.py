"""The reconciler on virtual time over the in-memory store model, for two bugs the deterministic
simulation with faults found: a leader round longer than the lease let the live replica's lease lapse
(the next leader then ended its in-flight reservations under it), and a copy left on a host by a start
whose reply was lost was never stopped once its record was placed on another host. And the leader
lease itself: renewed through a long round, so no other replica leads during it, and a round whose
lease could not be renewed stops before its next step."""

from __future__ import annotations

import asyncio
import random

from corral.agent.agent import Agent
from corral.agent.client import LocalAgentClient
from corral.agent.config import AgentConfig
from corral.agent.protocol import StartSandbox
from corral.control.agents import LocalAgents
from corral.control.config import ControlConfig
from corral.control.failover import Failover
from corral.control.heartbeats import to_store
from corral.control.locations import LocationCache
from corral.control.metrics import Metrics
from corral.control.placement import Placement
from corral.control.reconcile import LEADER_LEASE, Reconciler
from corral.control.retry import RetryAfter
from corral.control.templates import Templates
from corral.control.view import ViewCache
from corral.runtime.sim import SimRuntime
from corral.sim.flow.vtime import VirtualClock, run_virtual
from corral.store import SandboxRecord, SandboxState, StoreUnavailable
from corral.testing.store import ModelStore


def _reconciler(
    store: ModelStore, clock: VirtualClock, agents: LocalAgents, replica_id: str = "r1"
) -> Reconciler:
    config = ControlConfig(replica_id=replica_id, replica_lease_s=3.0, reconcile_interval_s=1.0)
    t = config.timeouts
    view = ViewCache(store, clock, t.view_ttl_s, t.heartbeat_interval_s)
    metrics, locations = Metrics(), LocationCache()
    retry = RetryAfter(clock, t, config.retry_after_min_s, config.retry_after_max_s)
    templates = Templates(store, clock)
    placement = Placement(store, view, agents, templates, config, clock, random.Random(0), metrics, retry)
    failover = Failover(store, view, placement, None, clock, t)
    return Reconciler(store, view, agents, config, clock, metrics, retry, locations, failover)


async def _lapses_during_a_long_round(round_s: float) -> list[float]:
    loop = asyncio.get_running_loop()
    clock = VirtualClock(loop)
    store = ModelStore(clock, random.Random(0))
    rec = _reconciler(store, clock, LocalAgents())

    async def long_round() -> None:
        await asyncio.sleep(round_s)

    rec.leader_work.append(long_round)
    task = loop.create_task(rec.run())
    lapsed = []
    try:
        for _ in range(int(3 * round_s / 0.25)):
            await asyncio.sleep(0.25)
            if rec.is_leader and store.replicas.get("r1", 0.0) <= clock.now():
                lapsed.append(clock.now())
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    return lapsed


def test_a_leader_round_longer_than_the_lease_does_not_lapse_it() -> None:
    assert run_virtual(_lapses_during_a_long_round(10.0), 1_000_000.0) == []


async def _copies_after_a_lost_reply() -> tuple[list[str], list[str], SandboxState]:
    loop = asyncio.get_running_loop()
    clock = VirtualClock(loop)
    store = ModelStore(clock, random.Random(0))
    agents = LocalAgents()
    hosts = {
        h: Agent(AgentConfig(h, 8192, 8.0), SimRuntime(clock, random.Random(h)), clock=clock)
        for h in ("h1", "h2")
    }
    for h, agent in hosts.items():
        agents.add(h, LocalAgentClient(agent))
    tenant = await store.create_tenant("t", max_sandboxes=10, max_memory_mb=1 << 20)
    rec = SandboxRecord(id="sb-1", tenant_id=tenant.id, template="default", memory_mb=256, cpus=0.5)
    await store.create_sandbox(rec)
    # The first host started it but its reply was lost; the create then placed it on the second.
    for agent in hosts.values():
        await agent.start(StartSandbox(id="sb-1", memory_mb=256, cpus=0.5))
    await store.set_sandbox_state("sb-1", SandboxState.RUNNING, expect=SandboxState.RESERVED, host_id="h2")
    reconciler = _reconciler(store, clock, agents)
    for _ in range(15):
        for agent in hosts.values():
            await store.upsert_heartbeat(to_store(agent.heartbeat()))
        await reconciler.tick()
        await asyncio.sleep(1.0)
    final = await store.get_sandbox("sb-1")
    assert final is not None
    return hosts["h1"].sandbox_ids(), hosts["h2"].sandbox_ids(), final.state


def test_a_copy_on_a_host_its_record_does_not_name_is_stopped() -> None:
    on_h1, on_h2, state = run_virtual(_copies_after_a_lost_reply(), 1_000_000.0)
    assert (on_h1, on_h2, state) == ([], ["sb-1"], SandboxState.RUNNING)


async def _other_leaders_during_a_long_round(round_s: float) -> tuple[list[float], list[float]]:
    """While r1 leads a round of ``round_s``, r2 tries to take the lease every half second."""
    loop = asyncio.get_running_loop()
    clock = VirtualClock(loop)
    store = ModelStore(clock, random.Random(0))
    rec = _reconciler(store, clock, LocalAgents())
    rounds: list[float] = []

    async def long_round() -> None:
        rounds.append(clock.now())
        await asyncio.sleep(round_s)

    rec.leader_work.append(long_round)
    task = loop.create_task(rec.run())
    taken: list[float] = []
    try:
        for _ in range(int(round_s / 0.5)):
            await asyncio.sleep(0.5)
            if await store.try_lead(LEADER_LEASE, "r2", 3.0):
                taken.append(clock.now())
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    return rounds, taken


def test_no_other_replica_leads_during_a_round_longer_than_the_lease() -> None:
    rounds, taken = run_virtual(_other_leaders_during_a_long_round(10.0), 1_000_000.0)
    assert rounds == [1_000_000.0] and taken == []


async def _a_round_whose_lease_lapsed() -> tuple[list[str], bool, bool]:
    """r1's round begins; from then on the store refuses its leader renewals, for longer than the
    lease, and r2 takes the lease once it lapses."""
    loop = asyncio.get_running_loop()
    clock = VirtualClock(loop)
    store = ModelStore(clock, random.Random(0))
    rec = _reconciler(store, clock, LocalAgents())
    steps: list[str] = []
    try_lead = store.try_lead

    async def refused_to_r1(name: str, holder: str, ttl_s: float) -> bool:
        if holder == "r1" and steps:
            raise StoreUnavailable("r1 cannot reach the store")
        return await try_lead(name, holder, ttl_s)

    store.try_lead = refused_to_r1  # type: ignore[method-assign]

    async def first() -> None:
        steps.append("first")
        await asyncio.sleep(5.0)

    async def second() -> None:
        steps.append("second")

    rec.leader_work += [first, second]
    task = loop.create_task(rec.run())
    try:
        await asyncio.sleep(4.0)
        r2_leads = await store.try_lead(LEADER_LEASE, "r2", 3.0)
        await asyncio.sleep(3.0)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    return steps, r2_leads, rec.leads()


def test_a_round_stops_before_its_next_step_once_its_lease_could_lapse() -> None:
    steps, r2_leads, r1_leads = run_virtual(_a_round_whose_lease_lapsed(), 1_000_000.0)
    assert r2_leads and not r1_leads
    assert steps == ["first"]
