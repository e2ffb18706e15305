"""Heartbeats: what they carry, that their sequence only moves forward, and that a control plane that is
down never stops the agent (nor its starts)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

import httpx
import pytest

from corral.agent import (
    Agent,
    AgentHeartbeat,
    HeartbeatRejected,
    StartSandbox,
    http_heartbeat_sink,
)
from corral.agent.protocol import Capacity, HeartbeatReply
from corral.core import ManualClock
from corral.core.admission import admittable_mb
from corral.core.listing import digest_of
from corral.core.types import HOST_FACTS, AdmissionMode, SandboxUsage
from corral.runtime.base import SandboxNotFound
from corral.runtime.sim import SimRuntime


async def test_heartbeat_payload(make_agent: Callable[..., Agent], clock: ManualClock) -> None:
    agent = make_agent(
        admission=AdmissionMode.WORKING_SET, templates=["python", "node"], gpu=None, stream_restore=True
    )
    await agent.start(StartSandbox(id="web", memory_mb=4096, cpus=2.0, template="python"))
    await agent.start(StartSandbox(id="db", memory_mb=2048, cpus=1.0, stateful=True))
    clock.advance(30)
    await agent.measure()  # a reading replaces the reserve once two agree
    clock.advance(1)
    hb = await agent.beat()

    assert hb.agent_id == "host-1" and hb.address == "http://127.0.0.1:7070"
    assert hb.sent_at == clock.now()
    assert hb.memory_mb_total == 16_384 and hb.cpu_total == 8.0 and hb.cpu_used == 3.0
    assert hb.memory_admission is AdmissionMode.WORKING_SET
    assert hb.templates == ["node", "python"] and hb.runtime == "sim" and hb.role == "worker"
    assert hb.stream_restore is True and hb.intake_open is True
    assert hb.sandbox_ids == ["db", "web"]
    infos = {i.id: i for i in agent.list()}
    assert hb.memory_mb_used == sum(i.resident_mb or 0 for i in infos.values()) > 0
    # The published verdict is the core function's result, nothing else.
    usages = [SandboxUsage(i.memory_mb, i.resident_mb, i.stateful) for i in infos.values()]
    assert hb.memory_mb_admittable == admittable_mb(16_384, usages, AdmissionMode.WORKING_SET, agent.policy)
    # Drain state is the control plane's: the agent never sends one.
    assert "state" not in hb.model_dump()
    # It survives the wire.
    assert AgentHeartbeat.model_validate_json(hb.model_dump_json()) == hb


async def test_the_wire_carries_every_host_fact_and_the_view_is_built_from_them(
    make_agent: Callable[..., Agent],
) -> None:
    # One declaration (HostFacts): a fact added there and not to the wire model fails here.
    assert set(HOST_FACTS) <= set(Capacity.model_fields)
    agent = make_agent(templates=["python"], gpu="a10", stream_restore=True)
    hb = agent.heartbeat()
    view = hb.host_view(heartbeat_at=5.0)
    assert view.facts() == hb.facts() == agent.capacity().facts()
    assert view.templates == frozenset({"python"}) and view.gpu == "a10" and view.stream_restore
    assert (view.id, view.heartbeat_at) == ("host-1", 5.0)


async def test_heartbeats_carry_changes_once_a_listing_is_acknowledged(
    make_agent: Callable[..., Agent],
) -> None:
    agent = make_agent()
    await agent.start(StartSandbox(id="a", memory_mb=256))
    first = agent.heartbeat()
    assert first.base is None and first.sandbox_ids == ["a"]
    agent.acknowledge(first, HeartbeatReply(listed_seq=first.seq))
    await agent.start(StartSandbox(id="b", memory_mb=256, epoch=4))
    await agent.stop("a")
    second = agent.heartbeat()
    assert second.base == first.seq and second.sandbox_ids == []
    assert (second.added, second.removed, second.epochs) == (["b"], ["a"], {"b": 4})
    assert second.digest == digest_of({"b": 4})
    # A reply naming another heartbeat (or none) acknowledges nothing: the next one is whole.
    agent.acknowledge(second, HeartbeatReply(listed_seq=first.seq))
    third = agent.heartbeat()
    assert third.base is None and third.sandbox_ids == ["b"] and third.digest == second.digest
    # A reply from a control plane that takes whole sets only (no listed_seq) keeps them whole.
    agent.acknowledge(third, HeartbeatReply())
    assert agent.heartbeat().base is None


async def test_seq_is_strictly_increasing_even_across_a_restart(
    make_agent: Callable[..., Agent], clock: ManualClock
) -> None:
    agent = make_agent()
    seqs = [agent.heartbeat().seq for _ in range(5)]
    assert seqs == sorted(set(seqs)) and len(seqs) == 5
    clock.advance(2.0)
    restarted = make_agent()
    assert restarted.heartbeat().seq > seqs[-1]


async def test_loop_survives_a_control_plane_that_is_down(make_agent: Callable[..., Agent]) -> None:
    received: list[AgentHeartbeat] = []
    failures = 0
    enough = asyncio.Event()

    async def flaky(hb: AgentHeartbeat) -> None:
        nonlocal failures
        if failures < 3:
            failures += 1
            raise httpx.ConnectError("control plane down")
        received.append(hb)
        if len(received) >= 2:
            enough.set()

    agent = make_agent(sink=flaky, heartbeat_interval_s=0.001)
    loop = asyncio.create_task(agent.run_heartbeats())
    await asyncio.wait_for(enough.wait(), timeout=30)
    loop.cancel()
    with pytest.raises(asyncio.CancelledError):
        await loop
    assert agent.heartbeat_failures == 3
    assert received[0].seq > 3  # the failed ones consumed seqs; nothing went backwards
    assert received[1].seq > received[0].seq


async def test_a_stuck_sink_never_blocks_starts(make_agent: Callable[..., Agent]) -> None:
    stuck = asyncio.Event()

    async def hangs(hb: AgentHeartbeat) -> None:
        stuck.set()
        await asyncio.Event().wait()  # a control plane that never answers

    agent = make_agent(sink=hangs, heartbeat_interval_s=0.01)
    loop = asyncio.create_task(agent.run_heartbeats())
    await stuck.wait()
    info = await agent.start(StartSandbox(id="a", memory_mb=512))
    assert info.id == "a"
    loop.cancel()
    with pytest.raises(asyncio.CancelledError):
        await loop


async def test_http_sink_posts_to_the_agent_route_with_the_token(make_agent: Callable[..., Agent]) -> None:
    seen: list[httpx.Request] = []

    def control_plane(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(204 if len(seen) == 1 else 503, json={"error": {"code": "store_unavailable"}})

    sink = http_heartbeat_sink("http://cp.test/", "agent-token", transport=httpx.MockTransport(control_plane))
    agent = make_agent(sink=sink)
    await agent.start(StartSandbox(id="a", memory_mb=512))
    hb = await agent.beat()
    (req,) = seen
    assert req.method == "POST" and str(req.url) == "http://cp.test/v1/agent/heartbeat"
    assert req.headers["Authorization"] == "Bearer agent-token"
    assert AgentHeartbeat.model_validate(json.loads(req.content)) == hb
    with pytest.raises(HeartbeatRejected) as rejected:
        await agent.beat()
    assert rejected.value.status == 503
    await sink.aclose()


async def test_heartbeat_becomes_the_cores_host_view(make_agent: Callable[..., Agent]) -> None:
    from corral.core import CreateRequest, HostState, host_fits
    from corral.core.types import NO_PENDING

    agent = make_agent(admission=AdmissionMode.COMMITTED, templates=["python"])
    await agent.start(StartSandbox(id="a", memory_mb=10_000))
    hb = agent.heartbeat()
    view = hb.host_view(heartbeat_at=hb.sent_at + 0.5, state=HostState.DRAINING)
    assert view.id == "host-1" and view.heartbeat_at == hb.sent_at + 0.5 and view.state is HostState.DRAINING
    assert view.templates == frozenset({"python"}) and view.memory_admission is AdmissionMode.COMMITTED
    assert view.memory_mb_admittable == agent.admittable_mb() == 4336
    # The scheduler's check on the published verdict agrees with the agent's own gate.
    assert host_fits(view, NO_PENDING, CreateRequest(memory_mb=4336))
    assert not host_fits(view, NO_PENDING, CreateRequest(memory_mb=4337))
    assert make_agent().heartbeat().host_view().templates is None


class _SlowTeardown(SimRuntime):
    """A runtime whose sandbox ``gone`` has ended on its own, and whose teardown takes as long as a
    gVisor container's can (runsc's kill and delete): until ``done`` is set."""

    def __init__(self, clock: ManualClock) -> None:
        super().__init__(clock=clock)
        self.done = asyncio.Event()
        self.stopped: list[str] = []

    async def resident_mb(self, sandbox_id: str) -> int | None:
        if sandbox_id == "gone":
            raise SandboxNotFound(sandbox_id)
        return await super().resident_mb(sandbox_id)

    async def stop(self, sandbox_id: str) -> None:
        await self.done.wait()
        self.stopped.append(sandbox_id)
        await super().stop(sandbox_id)


async def test_a_sandbox_that_ended_on_its_own_is_torn_down_without_holding_the_heartbeat(
    make_agent: Callable[..., Agent], clock: ManualClock
) -> None:
    runtime = _SlowTeardown(clock)
    agent = make_agent(runtime=runtime)
    await agent.start(StartSandbox(id="gone", memory_mb=512))
    await agent.start(StartSandbox(id="kept", memory_mb=512))
    # The reading and the heartbeat go on while the teardown is under way.
    await asyncio.wait_for(agent.measure(), 5)
    hb = await asyncio.wait_for(agent.beat(), 5)
    assert hb.sandbox_ids == ["kept"] and runtime.stopped == []
    runtime.done.set()
    for _ in range(100):
        if runtime.stopped:
            break
        await asyncio.sleep(0.01)
    assert runtime.stopped == ["gone"]
