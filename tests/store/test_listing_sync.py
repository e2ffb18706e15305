"""An agent and a control plane keep one listing between them through a wire that loses heartbeats,
loses replies, delivers some twice and some late and out of order, and through restarts of either
side: whatever happened, once heartbeats get through again the store lists exactly what the agent runs
for records, and in steady state heartbeats carry changes, not the whole set."""

from __future__ import annotations

import contextlib
import random

import pytest

from corral.agent.agent import Agent
from corral.agent.config import AgentConfig
from corral.agent.protocol import ROLE_WARM, AgentHeartbeat, HeartbeatReply, StartSandbox
from corral.control.agents import LocalAgents
from corral.control.config import ControlConfig
from corral.control.plane import ControlPlane, build_replica
from corral.core import ManualClock
from corral.runtime.sim import SimRuntime, SimState
from corral.store import Store, open_store

HOST = "h1"


class Wire:
    """Between the agent and the control plane: each heartbeat is lost, held back (delivered later,
    after newer ones), delivered with its reply lost, delivered twice, or delivered, as ``rng`` says."""

    def __init__(self, plane: ControlPlane, rng: random.Random, mishaps: bool = True) -> None:
        self.plane = plane
        self.rng = rng
        self.mishaps = mishaps
        self.held: list[AgentHeartbeat] = []
        self.whole = 0  # heartbeats that carried the whole set
        self.sent = 0

    async def __call__(self, hb: AgentHeartbeat) -> HeartbeatReply:
        self.sent += 1
        self.whole += hb.base is None
        roll = self.rng.random() if self.mishaps else 1.0
        if self.held and self.rng.random() < 0.3:
            await self.plane.heartbeat_reply(self.held.pop(0))  # late, and after newer ones
        if roll < 0.1:
            raise ConnectionError("heartbeat lost")
        if roll < 0.2:
            self.held.append(hb)
            raise ConnectionError("no reply yet")
        reply = await self.plane.heartbeat_reply(hb)
        if roll < 0.3:
            raise ConnectionError("reply lost")
        if roll < 0.4:
            await self.plane.heartbeat_reply(hb)  # delivered twice
        return reply


def owned(agent: Agent) -> dict[str, int]:
    roles = agent.warm.roles()
    return {i.id: i.epoch for i in agent.list() if roles.get(i.id) != ROLE_WARM}


async def assert_agree(store: Store, agent: Agent, ever: set[str]) -> None:
    host = await store.get_host(HOST)
    assert host is not None and host.listed_seq == agent._seq
    assert await store.listed(HOST, ever) == owned(agent)
    assert host.sandbox_count == len(owned(agent))


def new_agent(state: SimState, clock: ManualClock, wire: Wire) -> Agent:
    return Agent(
        AgentConfig(HOST, 1 << 20, 1000.0), SimRuntime(clock=clock, state=state), clock=clock, sink=wire
    )


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_the_listing_survives_a_wire_that_loses_duplicates_and_reorders(
    store: Store, store_url: str, clock: ManualClock, seed: int
) -> None:
    rng = random.Random(seed)
    plane = build_replica(store, LocalAgents(), ControlConfig(), clock, random.Random())
    wire = Wire(plane, rng)
    state = SimState()
    agent = new_agent(state, clock, wire)
    ever: set[str] = set()
    for step in range(120):
        clock.advance(0.5)
        live = list(agent._live)
        if live and rng.random() < 0.35:
            await agent.stop(rng.choice(live))
        else:
            sid = f"sb-{seed}-{step}"
            await agent.start(StartSandbox(id=sid, memory_mb=64, epoch=rng.choice([0, 0, 1, 7])))
            ever.add(sid)
        if rng.random() < 0.1:
            state.sandboxes.pop(rng.choice(live or [""]), None)  # died on its own, unnoticed so far
        if step == 60:
            agent = new_agent(state, clock, wire)  # the agent restarts over what still runs
            await agent.adopt()
        if step == 80:
            # The control plane restarts: a new store client and a new plane over the same data.
            other = open_store(store_url, clock=clock)
            wire.plane = build_replica(other, LocalAgents(), ControlConfig(), clock, random.Random())
        with contextlib.suppress(ConnectionError):
            await agent.beat()
    wire.mishaps = False
    wire.held.clear()
    await agent.beat()  # may be the whole set (the last reply was lost)
    await agent.beat()
    await assert_agree(store, agent, ever)
    # Quiet from here: every heartbeat is changes on an acknowledged listing.
    whole = wire.whole
    for _ in range(3):
        await agent.start(StartSandbox(id=f"sb-{seed}-more-{_}", memory_mb=64))
        ever.add(f"sb-{seed}-more-{_}")
        await agent.beat()
    assert wire.whole == whole
    await assert_agree(store, agent, ever)
    await wire.plane.store.close()


async def test_a_heartbeat_held_back_past_the_next_one_cannot_roll_the_listing_back(
    store: Store, clock: ManualClock
) -> None:
    plane = build_replica(store, LocalAgents(), ControlConfig(), clock, random.Random())
    held: list[AgentHeartbeat] = []

    async def sink(hb: AgentHeartbeat) -> HeartbeatReply:
        if not held:
            held.append(hb)
            raise ConnectionError("slow")
        return await plane.heartbeat_reply(hb)

    agent = Agent(AgentConfig(HOST, 1 << 20, 1000.0), SimRuntime(clock=clock), clock=clock, sink=sink)
    await agent.start(StartSandbox(id="sb-a", memory_mb=64))
    with pytest.raises(ConnectionError):
        await agent.beat()
    await agent.stop("sb-a")
    await agent.start(StartSandbox(id="sb-b", memory_mb=64))
    await agent.beat()
    late = await plane.heartbeat_reply(held[0])  # lists sb-a, older than what the store holds
    assert not late.accepted
    await agent.beat()
    await assert_agree(store, agent, {"sb-a", "sb-b"})
