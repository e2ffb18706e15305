"""The local admission gate: the core's arithmetic, enforced at every start and published as is."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable

import pytest
from agent_doubles import POLICY, GatedRuntime
from hypothesis import given, settings
from hypothesis import strategies as st

from corral.agent import Agent, AgentConfig, AgentRefusal, StartSandbox
from corral.codes import ErrorCode
from corral.core import ManualClock
from corral.core.admission import admittable_mb, fits
from corral.core.types import AdmissionMode, CreateRequest, SandboxUsage
from corral.runtime.base import SandboxSpec
from corral.runtime.sim import SimRuntime

COMMITTED = AdmissionMode.COMMITTED
WORKING_SET = AdmissionMode.WORKING_SET


def core_admittable(agent: Agent) -> int:
    """The core function over the agent's sandboxes, rebuilt from what the agent reports."""
    usages = [SandboxUsage(i.memory_mb, i.resident_mb, i.stateful) for i in agent.list()]
    return admittable_mb(agent.memory_mb_total, usages, agent.admission, agent.policy)


async def test_committed_refuses_what_does_not_fit(make_agent: Callable[..., Agent]) -> None:
    agent = make_agent(admission=COMMITTED)  # 16384 - 2048 headroom = 14336 admittable
    for i in range(3):
        await agent.start(StartSandbox(id=f"s{i}", memory_mb=4096))
    assert agent.admittable_mb() == 14_336 - 3 * 4096
    with pytest.raises(AgentRefusal) as refused:
        await agent.start(StartSandbox(id="big", memory_mb=4096))
    assert refused.value.code == ErrorCode.HOST_DOES_NOT_FIT
    assert refused.value.retryable and refused.value.retry_after_s
    assert refused.value.details["needed_mb"] == 4096
    assert refused.value.details["admittable_mb"] == 2048
    # Exactly what is left still fits: the boundary is the core's ">=".
    await agent.start(StartSandbox(id="exact", memory_mb=2048))
    assert agent.admittable_mb() == 0
    assert [i.id for i in agent.list()] == ["s0", "s1", "s2", "exact"]
    assert agent.refusals == {ErrorCode.HOST_DOES_NOT_FIT: 1}


async def test_working_set_charges_the_reserve_until_measured(
    make_agent: Callable[..., Agent], clock: ManualClock
) -> None:
    agent = make_agent(admission=WORKING_SET, settle_s=2.0)
    # A 4096 MiB sandbox is charged its reserve: max(512, 0.25 * 4096) = 1024.
    for i in range(14):
        await agent.start(StartSandbox(id=f"s{i}", memory_mb=4096))
    assert agent.admittable_mb() == 14_336 - 14 * 1024 == 0
    with pytest.raises(AgentRefusal) as refused:
        await agent.start(StartSandbox(id="s14", memory_mb=4096))
    assert refused.value.code == ErrorCode.HOST_DOES_NOT_FIT

    # A measurement that sees them before they settle changes nothing: the blind window stays charged.
    clock.advance(0.5)
    await agent.measure()
    assert all(i.resident_mb is None and i.charged_mb == 1024 for i in agent.list())
    assert agent.admittable_mb() == 0

    # Old enough, but the reading rose since the last one (a guest still faulting pages in): the
    # reserve stays.
    clock.advance(10.0)
    await agent.measure()
    assert all(i.resident_mb is None and i.charged_mb == 1024 for i in agent.list())
    # Once settled and stable over two readings, each is charged what it holds (the touch model: a
    # few hundred MiB).
    clock.advance(0.25)
    await agent.measure()
    infos = agent.list()
    assert all(i.resident_mb is not None and i.charged_mb == i.resident_mb < 1024 for i in infos)
    assert agent.admittable_mb() == core_admittable(agent) > 0
    await agent.start(StartSandbox(id="s14", memory_mb=4096))


async def test_stateful_is_charged_in_full_in_working_set_mode(
    make_agent: Callable[..., Agent], clock: ManualClock
) -> None:
    agent = make_agent(admission=WORKING_SET)
    await agent.start(StartSandbox(id="db", memory_mb=8192, stateful=True))
    assert agent.admittable_mb() == 14_336 - 8192
    clock.advance(60.0)
    await agent.measure()
    clock.advance(1.0)  # trusted once two readings agree
    await agent.measure()
    (db,) = agent.list()
    assert db.resident_mb is not None and db.resident_mb < 8192
    assert db.charged_mb == 8192  # measured, and still never part of the bet
    assert agent.admittable_mb() == 14_336 - 8192
    with pytest.raises(AgentRefusal):
        await agent.start(StartSandbox(id="db2", memory_mb=8192, stateful=True))
    # A stateless one of the same size is charged its reserve and fits.
    await agent.start(StartSandbox(id="web", memory_mb=8192))


async def test_starts_in_flight_are_pending_and_not_published(
    make_agent: Callable[..., Agent], clock: ManualClock
) -> None:
    runtime = GatedRuntime(clock, random.Random(1))
    agent = make_agent(runtime=runtime, admission=COMMITTED)
    first = asyncio.create_task(agent.start(StartSandbox(id="a", memory_mb=8192)))
    await runtime.wait_entered(1)
    assert agent.pending_mb == 8192
    # Nothing is live yet, but the start in flight is set aside: 14336 - 8192 < 8192.
    with pytest.raises(AgentRefusal) as refused:
        await agent.start(StartSandbox(id="b", memory_mb=8192))
    assert refused.value.code == ErrorCode.HOST_DOES_NOT_FIT
    assert refused.value.details["pending_mb"] == 8192
    # The heartbeat publishes the core's verdict over live sandboxes only: the control plane still holds
    # its own reservation for the start in flight, and would otherwise count it twice.
    hb = agent.heartbeat()
    assert hb.memory_mb_admittable == 14_336 and hb.sandbox_ids == [] and hb.starts_in_flight == 1
    runtime.open()
    await first
    assert agent.pending_mb == 0
    assert agent.heartbeat().memory_mb_admittable == 14_336 - 8192


async def test_failed_start_leaves_no_pending_and_no_sandbox(
    make_agent: Callable[..., Agent], runtime: SimRuntime
) -> None:
    agent = make_agent(admission=COMMITTED)
    await runtime.start(SandboxSpec(id="b", memory_mb=1024))  # the runtime refuses a second "b"
    with pytest.raises(AgentRefusal) as refused:
        await agent.start(StartSandbox(id="b", memory_mb=1024))
    assert refused.value.code == ErrorCode.START_FAILED
    assert agent.pending_mb == 0 and agent.limiter.in_flight == 0
    assert agent.admittable_mb() == 14_336


async def test_cancelled_start_releases_its_slot_and_pending(
    make_agent: Callable[..., Agent], clock: ManualClock
) -> None:
    runtime = GatedRuntime(clock, random.Random(1))
    agent = make_agent(runtime=runtime, admission=COMMITTED)
    task = asyncio.create_task(agent.start(StartSandbox(id="a", memory_mb=4096)))
    await runtime.wait_entered(1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert agent.pending_mb == 0 and agent.limiter.in_flight == 0
    runtime.open()
    await asyncio.sleep(0)  # let the reaper run
    assert await runtime.list() == [] and agent.list() == []


@settings(max_examples=60, deadline=None)
@given(
    mode=st.sampled_from([COMMITTED, WORKING_SET]),
    requests=st.lists(
        st.tuples(st.integers(min_value=1, max_value=6000), st.booleans(), st.booleans()), max_size=25
    ),
)
def test_gate_is_the_core_function(mode: AdmissionMode, requests: list[tuple[int, bool, bool]]) -> None:
    """Whatever arrives, the agent admits exactly what the core's ``fits`` admits, and publishes exactly
    the core's ``admittable_mb``."""

    async def scenario() -> None:
        clock = ManualClock(0.0)
        agent = Agent(
            AgentConfig("h", 16_384, 8.0, admission=mode, policy=POLICY, settle_s=1.0),
            SimRuntime(clock, random.Random(3)),
            clock=clock,
            pressure=lambda: 0.0,
        )
        for n, (memory_mb, stateful, measure_first) in enumerate(requests):
            if measure_first:
                clock.advance(1.5)
                await agent.measure()
            expected = fits(
                core_admittable(agent), 0, CreateRequest(memory_mb=memory_mb, stateful=stateful), mode, POLICY
            )
            try:
                await agent.start(StartSandbox(id=f"s{n}", memory_mb=memory_mb, stateful=stateful))
                admitted = True
            except AgentRefusal as exc:
                assert exc.code == ErrorCode.HOST_DOES_NOT_FIT
                admitted = False
            assert admitted == expected
            assert agent.heartbeat().memory_mb_admittable == core_admittable(agent)

    asyncio.run(scenario())


async def test_stop_during_start_is_a_retryable_not_now(
    make_agent: Callable[..., Agent], clock: ManualClock
) -> None:
    runtime = GatedRuntime(clock, random.Random(1))
    agent = make_agent(runtime=runtime)
    task = asyncio.create_task(agent.start(StartSandbox(id="a", memory_mb=512)))
    await runtime.wait_entered(1)
    with pytest.raises(AgentRefusal) as refused:
        await agent.stop("a")
    assert refused.value.code == ErrorCode.SANDBOX_STARTING and refused.value.retry_after_s
    runtime.open()
    await task
    await agent.stop("a")
    assert agent.list() == [] and await runtime.list() == []
