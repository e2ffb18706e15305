"""When a sandbox's measured memory replaces its reserve: the runtime's settle time, then two readings
that agree; and the heartbeat that follows at once so the control plane sees the room."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable

import pytest
from agent_doubles import POLICY

from corral.agent import Agent
from corral.agent.beats import EARLY_BEAT_AFTER_S
from corral.agent.protocol import AgentHeartbeat, StartSandbox
from corral.core import AdmissionMode, ManualClock
from corral.core.admission import reserve_mb
from corral.core.settle import DEFAULT_SETTLE_S, SettleRule
from corral.runtime.sim import SimRuntime


class ExactRuntime(SimRuntime):
    """Readings exact from the first page and flat, as a process in its own memory cgroup."""

    memory_settle_s = 0.0

    async def resident_mb(self, sandbox_id: str) -> int | None:
        await super().resident_mb(sandbox_id)  # still raises for an unknown sandbox
        return 1


class RampingRuntime(SimRuntime):
    """A guest that ramps (the sim touch model) but claims its readings are good from the start."""

    memory_settle_s = 0.0


def test_settle_rule() -> None:
    rule = SettleRule(settle_s=10.0)
    assert not rule.trusted(9.9, 300, 300)  # too young, however stable
    assert not rule.trusted(60.0, 300, None)  # one reading is not a trend
    assert rule.trusted(10.0, 300, 299)
    assert not rule.trusted(12.0, 300, 250)  # still rising
    assert rule.trusted(0.0, 1, 1) is False and SettleRule(0.0).trusted(0.0, 1, 1)
    with pytest.raises(ValueError):
        SettleRule(-1.0)


def test_each_runtime_declares_its_settle_time(make_agent: Callable[..., Agent], clock: ManualClock) -> None:
    from corral.runtime.process import ProcessRuntime

    assert ProcessRuntime.memory_settle_s == 0.0
    assert SimRuntime.memory_settle_s == DEFAULT_SETTLE_S
    assert make_agent().settle_s == DEFAULT_SETTLE_S
    assert make_agent(runtime=ExactRuntime(clock, random.Random(1))).settle_s == 0.0
    assert make_agent(runtime=ExactRuntime(clock, random.Random(1)), settle_s=3.0).settle_s == 3.0


async def test_a_guest_keeps_its_reserve_through_its_ramp(
    make_agent: Callable[..., Agent], clock: ManualClock
) -> None:
    agent = make_agent(admission=AdmissionMode.WORKING_SET)
    await agent.start(StartSandbox(id="vm", memory_mb=2048))
    for _ in range(36):  # a reading every 0.25 s for 9 s
        clock.advance(0.25)
        await agent.measure()
        assert agent.list()[0].resident_mb is None and agent.list()[0].charged_mb == 512


async def test_a_ramping_reading_is_not_trusted_even_with_no_settle_time(
    make_agent: Callable[..., Agent], clock: ManualClock
) -> None:
    agent = make_agent(admission=AdmissionMode.WORKING_SET, runtime=RampingRuntime(clock, random.Random(2)))
    await agent.start(StartSandbox(id="vm", memory_mb=2048))
    for _ in range(4):  # the first second of the ramp: every reading well above the one before
        clock.advance(0.25)
        await agent.measure()
        assert agent.list()[0].resident_mb is None


async def test_a_trusted_reading_sends_the_next_heartbeat_at_once(
    make_agent: Callable[..., Agent], clock: ManualClock
) -> None:
    beats: list[AgentHeartbeat] = []
    roomier = asyncio.Event()

    async def sink(hb: AgentHeartbeat) -> None:
        beats.append(hb)
        if len(beats) > 1 and hb.memory_mb_admittable > beats[0].memory_mb_admittable:
            roomier.set()

    # A heartbeat interval far longer than the test: only the early beat can set the event.
    agent = make_agent(
        admission=AdmissionMode.WORKING_SET,
        runtime=ExactRuntime(clock, random.Random(3)),
        sink=sink,
        heartbeat_interval_s=600.0,
    )
    for i in range(12):  # the host is nearly full on their reserves
        await agent.start(StartSandbox(id=f"p{i}", memory_mb=4096))
    loop = asyncio.create_task(agent.run_heartbeats())
    try:
        await asyncio.wait_for(roomier.wait(), timeout=60)
    finally:
        loop.cancel()
        with pytest.raises(asyncio.CancelledError):
            await loop
    reserves = 12 * reserve_mb(4096, POLICY)
    assert beats[0].memory_mb_admittable == 16_384 - 2048 - reserves == 2048  # headroom 2048
    assert beats[-1].memory_mb_admittable == 16_384 - 2048 - 12 * 1  # twelve exact 1 MiB readings
    assert all(i.charged_mb == 1 for i in agent.list())


async def test_a_small_gain_in_room_waits_until_the_last_heartbeat_is_old(
    make_agent: Callable[..., Agent], clock: ManualClock
) -> None:
    # A small gain in advertised room is worth a heartbeat before its time only once the last one is
    # a few seconds old: hosts beating at every settled sandbox would multiply a busy fleet's heartbeats.
    agent = make_agent(admission=AdmissionMode.WORKING_SET, runtime=ExactRuntime(clock, random.Random(3)))
    for i in range(3):
        await agent.start(StartSandbox(id=f"p{i}", memory_mb=512))
    agent.heartbeat()
    for _ in range(3):
        clock.advance(1)
        await agent.measure()
    assert all(i.charged_mb == 1 for i in agent.list())  # trusted: the room grew by 3 x 511 MiB
    assert not agent._roomier()
    clock.advance(EARLY_BEAT_AFTER_S)  # a small gain is told once the last heartbeat is that old
    assert agent._roomier()
    for i in range(3, 15):
        await agent.start(StartSandbox(id=f"p{i}", memory_mb=4096))
    agent.heartbeat()  # now nearly full on their reserves
    for _ in range(3):
        clock.advance(1)
        await agent.measure()
    assert agent._roomier()


class CountingRuntime(SimRuntime):
    """The sim runtime, counting the readings asked of it, three settled ones per heartbeat."""

    settled_readings_per_beat = 3

    def __init__(self, clock: ManualClock) -> None:
        super().__init__(clock=clock, rng=random.Random(5))
        self.read: list[str] = []

    async def resident_mb(self, sandbox_id: str) -> int | None:
        self.read.append(sandbox_id)
        return await super().resident_mb(sandbox_id)


async def test_settled_sandboxes_take_turns_being_read(
    make_agent: Callable[..., Agent], clock: ManualClock
) -> None:
    runtime = CountingRuntime(clock)
    agent = make_agent(runtime=runtime)
    for i in range(7):
        await agent.start(StartSandbox(id=f"s{i}", memory_mb=256))
    for _ in range(4):  # settle every one (readings every beat while they settle)
        clock.advance(30)
        await agent.beat()
    assert not agent._live.untrusted
    runtime.read.clear()
    await agent.start(StartSandbox(id="new", memory_mb=256))
    beats = []
    for _ in range(6):  # the turn under way, then one that includes it
        runtime.read.clear()
        await agent.beat()
        beats.append(set(runtime.read))
    # Young, "new" takes its turn with the rest: at most three readings a heartbeat, and every
    # sandbox gets a turn.
    assert all(len(b) <= 3 for b in beats)
    assert set().union(*beats) >= {f"s{i}" for i in range(7)} | {"new"}
    # Once old enough to settle, it is read at every heartbeat until trusted, besides three others.
    clock.advance(agent.settle_s)
    for _ in range(2):
        runtime.read.clear()
        await agent.beat()
        assert "new" in runtime.read and len(set(runtime.read) - {"new"}) <= 3


async def test_sampling_between_beats_reads_only_sandboxes_old_enough_to_settle(
    make_agent: Callable[..., Agent], clock: ManualClock
) -> None:
    runtime = CountingRuntime(clock)
    agent = make_agent(runtime=runtime)
    await agent.start(StartSandbox(id="old", memory_mb=256))
    clock.advance(agent.settle_s)
    for i in range(20):  # a burst: young, untrusted, and nothing for the sampling to read yet
        await agent.start(StartSandbox(id=f"young{i}", memory_mb=256))
    assert len(agent._live.untrusted) == 21
    assert agent._settling() == {"old"}
    # Once settled, it is no longer read; the burst comes of age together.
    while "old" in agent._live.untrusted:
        clock.advance(1)
        await agent.measure(["old"])
    assert agent._settling() == set()
    clock.advance(agent.settle_s)
    assert agent._settling() == {f"young{i}" for i in range(20)}
    await agent.stop("young3")
    assert "young3" not in agent._settling()


async def test_the_gate_closing_sends_the_next_heartbeat_at_once(
    make_agent: Callable[..., Agent], clock: ManualClock
) -> None:
    # Creates sent to a host whose intake closed are refused until the control plane hears of it.
    beats: list[AgentHeartbeat] = []
    closed = asyncio.Event()

    async def sink(hb: AgentHeartbeat) -> None:
        beats.append(hb)
        if not hb.intake_open:
            closed.set()

    pressure = [0.0]
    agent = make_agent(sink=sink, heartbeat_interval_s=600.0, pressure=lambda: pressure[0])
    loop = asyncio.create_task(agent.run_heartbeats())
    try:
        await asyncio.wait_for(_first(beats), timeout=60)
        pressure[0] = 0.99
        assert not agent.observe_pressure()  # as the next start's check would
        await asyncio.wait_for(closed.wait(), timeout=60)
    finally:
        loop.cancel()
        with pytest.raises(asyncio.CancelledError):
            await loop
    assert [b.intake_open for b in beats] == [True, False]


async def _first(beats: list[AgentHeartbeat]) -> None:
    while not beats:
        await asyncio.sleep(0.01)
