"""A restarted agent re-adopts the sandboxes its runtime still runs and reports them at once."""

from __future__ import annotations

import random
from collections.abc import Callable

from corral.agent import Agent, ExecRequest, StartSandbox
from corral.core import ManualClock
from corral.core.admission import admittable_mb
from corral.core.types import AdmissionMode, SandboxUsage
from corral.runtime.sim import SimRuntime, SimState


async def test_restarted_agent_readopts_running_sandboxes(
    make_agent: Callable[..., Agent], clock: ManualClock, sim_state: SimState
) -> None:
    before = make_agent(admission=AdmissionMode.WORKING_SET)
    await before.start(StartSandbox(id="web", memory_mb=4096, hostname="web-1"))
    await before.start(StartSandbox(id="db", memory_mb=2048, stateful=True))
    await before.start(StartSandbox(id="gone", memory_mb=1024))
    await before.stop("gone")
    clock.advance(30)
    await before.measure()
    last_seq = before.heartbeat().seq
    del before  # the agent process dies; the sandboxes (the runtime's state) do not

    clock.advance(1)
    after = make_agent(
        admission=AdmissionMode.WORKING_SET, runtime=SimRuntime(clock, random.Random(9), state=sim_state)
    )
    assert after.list() == []
    assert await after.adopt() == 2
    hb = after.heartbeat()  # the first heartbeat already reports them
    assert hb.sandbox_ids == ["db", "web"]
    assert hb.seq > last_seq
    # Adopted sandboxes are charged their reserve until a measurement sees them again.
    assert {i.id: i.charged_mb for i in after.list()} == {"web": 1024, "db": 2048}
    usages = [SandboxUsage(4096, None, False), SandboxUsage(2048, None, True)]
    assert hb.memory_mb_admittable == admittable_mb(16_384, usages, AdmissionMode.WORKING_SET, after.policy)
    # They are fully usable: exec, measure, stop.
    out = await after.exec("web", ExecRequest(command=["hostname"]))
    assert out.stdout == "web-1\n"
    clock.advance(5)
    await after.measure()
    clock.advance(1)  # a reading replaces the reserve once two agree
    await after.measure()
    assert all(i.resident_mb is not None for i in after.list())
    await after.stop("web")
    assert after.sandbox_ids() == ["db"]
    assert await after.adopt() == 0  # adopting again is harmless


async def test_adopt_forgets_sandboxes_the_runtime_lost(
    make_agent: Callable[..., Agent], runtime: SimRuntime
) -> None:
    agent = make_agent()
    await agent.start(StartSandbox(id="a", memory_mb=1024))
    await agent.start(StartSandbox(id="b", memory_mb=1024))
    await runtime.stop("a")  # died behind the agent's back
    await agent.adopt()
    assert agent.sandbox_ids() == ["b"]
    await runtime.stop("b")
    await agent.measure()  # a measurement notices too
    assert agent.sandbox_ids() == []
    assert agent.admittable_mb() == 16_384 - agent.policy.headroom_mb


async def test_a_paused_sandbox_is_adopted_paused(
    make_agent: Callable[..., Agent], clock: ManualClock, sim_state: SimState
) -> None:
    before = make_agent()
    await before.start(StartSandbox(id="held", memory_mb=1024))
    await before.start(StartSandbox(id="busy", memory_mb=1024))
    await before.pause("held")
    del before
    after = make_agent(runtime=SimRuntime(clock, random.Random(9), state=sim_state))
    assert await after.adopt() == 2
    assert {i.id: i.paused for i in after.list()} == {"held": True, "busy": False}
    assert not (await after.resume("held")).paused
