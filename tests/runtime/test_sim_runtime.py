"""The sim runtime: the touch model on an injected clock, honest exec, state that outlives the runtime."""

from __future__ import annotations

import random

import pytest

from corral.agent.agent import Agent
from corral.agent.config import AgentConfig
from corral.agent.errors import AgentRefusal
from corral.agent.pressure import sim_signal
from corral.agent.protocol import StartSandbox
from corral.core import AdmissionPolicy, ManualClock, TouchModel
from corral.runtime.base import Runtime, RuntimeFailure, SandboxNotFound, SandboxPaused, SandboxSpec
from corral.runtime.sim import SimRuntime, SimState


class ClockSleep:
    """``sleep`` that moves the manual clock instead of waiting."""

    def __init__(self, clock: ManualClock) -> None:
        self.clock = clock
        self.slept: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.clock.advance(seconds)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(100.0)


@pytest.fixture
def sim(clock: ManualClock) -> SimRuntime:
    return SimRuntime(clock, random.Random(42), sleep=ClockSleep(clock))


def test_is_a_runtime(sim: SimRuntime) -> None:
    runtime: Runtime = sim  # checked by mypy against the protocol
    assert runtime.name == "sim"


async def test_resident_memory_follows_the_shared_touch_model(clock: ManualClock) -> None:
    model = TouchModel(working_set_mb=600, base_mb=30, ramp_s=4.0, spike_probability=0.0)
    sim = SimRuntime(clock, random.Random(5), model)
    await sim.start(SandboxSpec(id="a", memory_mb=4096))
    # The same model with the same rng draws the same profile: one model, shared with the simulator.
    profile = model.profile(4096, random.Random(5))
    readings = []
    for age in [0.0, 1.0, 4.0, 30.0]:
        clock.set(100.0 + age)
        reading = await sim.resident_mb("a")
        assert reading == profile.resident_mb(age)
        readings.append(reading)
    assert readings[0] == 30 and readings == sorted(readings)
    assert 0.8 * 600 <= readings[-1] <= 1.2 * 600


async def test_resident_memory_never_exceeds_the_limit(clock: ManualClock) -> None:
    sim = SimRuntime(clock, random.Random(1), TouchModel(working_set_mb=5000, spike_probability=1.0))
    await sim.start(SandboxSpec(id="small", memory_mb=256))
    for _ in range(20):
        clock.advance(5)
        mb = await sim.resident_mb("small")
        assert mb is not None and mb <= 256


async def test_exec_answers_honestly_for_what_it_emulates(sim: SimRuntime) -> None:
    await sim.start(SandboxSpec(id="a", memory_mb=512, hostname="box-1", env={"LANG": "C"}))

    async def run(*argv: str, **kw: object) -> tuple[int, str, str]:
        r = await sim.exec("a", list(argv), **kw)  # type: ignore[arg-type]
        return r.exit_code, r.stdout, r.stderr

    assert await run("echo", "hello", "world") == (0, "hello world\n", "")
    assert await run("/bin/echo", "-n", "x") == (0, "x", "")
    assert await run("hostname") == (0, "box-1\n", "")
    assert await run("cat", "/etc/hostname") == (0, "box-1\n", "")
    assert await run("true") == (0, "", "")
    assert await run("false") == (1, "", "")
    assert await run("pwd", cwd="/work") == (0, "/work\n", "")
    assert await run("env", env={"A": "1"}) == (0, "A=1\nHOSTNAME=box-1\nLANG=C\n", "")
    code, out, err = await run("cat", "/etc/passwd")
    assert out == ""
    assert code == 1 and "No such file" in err and "sim runtime" in err


@pytest.mark.parametrize(
    "argv", [["python3", "-c", "print(1)"], ["sh", "-c", "echo hi"], ["ls", "/"], ["hostname", "-f"]]
)
async def test_exec_says_it_is_a_simulation_for_anything_else(sim: SimRuntime, argv: list[str]) -> None:
    await sim.start(SandboxSpec(id="a", memory_mb=512))
    r = await sim.exec("a", argv)
    assert r.exit_code != 0
    assert r.stdout == ""
    assert "simulation" in r.stderr and "not emulated" in r.stderr


async def test_sleep_passes_time_on_the_injected_clock(sim: SimRuntime, clock: ManualClock) -> None:
    await sim.start(SandboxSpec(id="a", memory_mb=512))
    r = await sim.exec("a", ["sleep", "2.5"])
    assert (r.exit_code, r.timed_out, r.duration_ms) == (0, False, 2500.0)
    assert clock.now() == 102.5
    r = await sim.exec("a", ["sleep", "60"], timeout_s=5.0)
    assert r.exit_code == 124 and r.timed_out and r.duration_ms == 5000.0
    r = await sim.exec("a", ["sleep", "soon"])
    assert r.exit_code == 1 and "invalid" in r.stderr


async def test_lifecycle_and_errors(sim: SimRuntime) -> None:
    handle = await sim.start(SandboxSpec(id="a", memory_mb=512))
    assert handle.started_at == 100.0 and handle.ref == "sim:a" and handle.spec.memory_mb == 512
    with pytest.raises(RuntimeFailure):
        await sim.start(SandboxSpec(id="a", memory_mb=512))
    assert [h.id for h in await sim.list()] == ["a"]
    await sim.stop("a")
    assert await sim.list() == []
    for call in (sim.stop("a"), sim.resident_mb("a"), sim.exec("a", ["true"])):
        with pytest.raises(SandboxNotFound):
            await call


async def test_start_latency_uses_the_injected_sleep(clock: ManualClock) -> None:
    sleep = ClockSleep(clock)
    sim = SimRuntime(clock, random.Random(0), sleep=sleep, start_latency_s=0.2)
    handle = await sim.start(SandboxSpec(id="a", memory_mb=512))
    assert sleep.slept == [0.2] and handle.started_at == pytest.approx(100.2)


async def test_state_outlives_the_runtime(clock: ManualClock) -> None:
    state = SimState()
    first = SimRuntime(clock, random.Random(1), state=state)
    await first.start(SandboxSpec(id="a", memory_mb=1024, stateful=True))
    clock.advance(10)
    before = await first.resident_mb("a")
    second = SimRuntime(clock, random.Random(2), state=state)
    (handle,) = await second.list()
    assert handle.id == "a" and handle.spec.stateful and handle.started_at == 100.0
    assert await second.resident_mb("a") == before  # the same sandbox, not a new draw
    assert state.started_total == 1
    assert state.resident_mb_total(clock.now()) == before


async def test_deterministic_from_its_seed(clock: ManualClock) -> None:
    async def run(seed: int) -> list[int | None]:
        sim = SimRuntime(clock, random.Random(seed), TouchModel(spike_probability=0.3))
        for i in range(50):
            await sim.start(SandboxSpec(id=f"s{i}", memory_mb=2048))
        clock.advance(20)
        return [await sim.resident_mb(f"s{i}") for i in range(50)]

    assert await run(7) == await run(7)
    assert await run(7) != await run(8)


async def test_spawn_pause_and_resume(sim: SimRuntime) -> None:
    await sim.start(SandboxSpec(id="a", memory_mb=512))
    spawned = await sim.spawn("a", ["echo", "hi"])
    assert await spawned.stdout.read() == b"hi\n" and await spawned.stderr.read() == b""
    assert await spawned.wait() == 0 and spawned.stdin is None
    assert not sim.paused("a")
    await sim.pause("a")
    assert sim.paused("a")
    for call in (sim.exec("a", ["true"]), sim.spawn("a", ["true"])):
        with pytest.raises(SandboxPaused):
            await call
    await sim.resume("a")
    assert (await sim.exec("a", ["true"])).exit_code == 0
    await sim.pause("a")
    await sim.stop("a")  # a paused sandbox stops like any other
    with pytest.raises(SandboxNotFound):
        sim.paused("a")


FLAT = TouchModel(working_set_mb=600, working_set_jitter=0.0, base_mb=24, ramp_s=1.0)


async def test_the_kernel_kills_the_largest_workload_when_the_host_runs_out(clock: ManualClock) -> None:
    sim = SimRuntime(clock, random.Random(1), FLAT, memory_mb=1000)
    for i in ("a", "b"):
        await sim.start(SandboxSpec(id=i, memory_mb=2048))
    assert sim.memory_used_ratio() == 48 / 1000
    clock.advance(60.0)
    # Two working sets of 600 MB on a 1000 MB host: one workload is killed (the tie: the greater id),
    # its memory is freed and stays freed; the sandbox itself lives on.
    assert [await sim.oom_kills(i) for i in ("a", "b")] == [0, 1]
    assert [await sim.resident_mb(i) for i in ("a", "b")] == [600, 24]
    assert sim.memory_used_ratio() == 624 / 1000
    assert sim.state.oom_kills_total == 1 and len(await sim.list()) == 2
    clock.advance(30.0)
    assert await sim.oom_kills("b") == 1  # nothing grew back: no second kill


async def test_an_unbounded_host_has_no_oom_killer(clock: ManualClock) -> None:
    sim = SimRuntime(clock, random.Random(1), FLAT)
    for i in ("a", "b"):
        await sim.start(SandboxSpec(id=i, memory_mb=2048))
    clock.advance(30.0)
    assert [await sim.oom_kills(i) for i in ("a", "b")] == [0, 0]
    assert sim.memory_used_ratio() is None
    with pytest.raises(ValueError):
        SimRuntime(clock, memory_mb=0)


async def test_the_agent_reports_the_kernels_kills_and_closes_intake_under_pressure(
    clock: ManualClock,
) -> None:
    sim = SimRuntime(clock, random.Random(1), FLAT, memory_mb=1000)
    policy = AdmissionPolicy(headroom_mb=0, reserve_floor_mb=0)
    signal = sim_signal(sim.memory_used_ratio, 0.6, 0.5)
    agent = Agent(AgentConfig("h", 1000, 4.0, policy=policy), sim, clock=clock, pressure=signal)
    for i in ("sb-a", "sb-b"):
        await agent.start(StartSandbox(id=i, memory_mb=1024))
    clock.advance(60.0)
    await agent.measure()
    hb = agent.heartbeat()
    assert hb.oom_kills == {"sb-b": 1} and agent.oom_kills_total == 1
    assert hb.memory_mb_used == 624  # the working sets as read after the kill
    # 62% of the host in use is above the gate's 60%: intake closes.
    with pytest.raises(AgentRefusal) as refused:
        await agent.start(StartSandbox(id="sb-c", memory_mb=1024))
    assert refused.value.code == "host_memory_pressure"
