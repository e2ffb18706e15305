"""Stop and exec: concurrent stops, a runtime that fails, a sandbox that dies under the agent."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Mapping, Sequence

import httpx
import pytest
from agent_doubles import TOKEN

from corral.agent import (
    Agent,
    AgentConflict,
    AgentRuntimeError,
    AgentSandboxNotFound,
    ExecRequest,
    StartSandbox,
)
from corral.agent.http import create_app
from corral.codes import ErrorCode
from corral.core import ManualClock
from corral.core.types import AdmissionMode
from corral.exec_result import ExecResult
from corral.runtime.base import (
    DEFAULT_PIDS,
    InvalidSandbox,
    RuntimeFailure,
    SandboxHandle,
    SandboxSpec,
)
from corral.runtime.sim import SimRuntime


class BrokenRuntime(SimRuntime):
    """A sim runtime whose stop and exec fail while ``broken`` is set."""

    broken = True

    async def stop(self, sandbox_id: str) -> None:
        if self.broken:
            raise RuntimeFailure("cgroup is busy")
        await super().stop(sandbox_id)

    async def exec(
        self,
        sandbox_id: str,
        command: Sequence[str],
        *,
        timeout_s: float = 30.0,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> ExecResult:
        if self.broken:
            raise RuntimeFailure("exec failed")
        return await super().exec(sandbox_id, command, timeout_s=timeout_s, env=env, cwd=cwd)


async def test_concurrent_stops_both_succeed_once(
    make_agent: Callable[..., Agent], runtime: SimRuntime
) -> None:
    agent = make_agent()
    await agent.start(StartSandbox(id="a", memory_mb=512))
    await asyncio.gather(agent.stop("a"), agent.stop("a"))
    assert agent.list() == [] and runtime.state.stopped_total == 1
    with pytest.raises(AgentSandboxNotFound):
        await agent.stop("a")


async def test_a_failed_stop_keeps_the_sandbox_charged(
    make_agent: Callable[..., Agent], clock: ManualClock
) -> None:
    runtime = BrokenRuntime(clock, random.Random(0))
    agent = make_agent(runtime=runtime, admission=AdmissionMode.COMMITTED)
    await agent.start(StartSandbox(id="a", memory_mb=4096))
    with pytest.raises(AgentRuntimeError) as failed:
        await agent.stop("a")
    assert failed.value.code == ErrorCode.RUNTIME_FAILED
    # As far as the agent knows it still runs, so it is still charged and still reported.
    assert agent.sandbox_ids() == ["a"] and agent.admittable_mb() == 14_336 - 4096
    runtime.broken = False
    await agent.stop("a")
    assert agent.sandbox_ids() == []


async def test_exec_errors_over_http(make_agent: Callable[..., Agent], clock: ManualClock) -> None:
    runtime = BrokenRuntime(clock, random.Random(0))
    runtime.broken = False
    agent = make_agent(runtime=runtime)
    await agent.start(StartSandbox(id="a", memory_mb=512))
    await agent.start(StartSandbox(id="b", memory_mb=512))
    auth = {"Authorization": f"Bearer {TOKEN}"}
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(create_app(agent, TOKEN)), base_url="http://a"
    ) as c:
        runtime.broken = True
        r = await c.post("/v1/sandboxes/a/exec", json={"command": ["true"]}, headers=auth)
        assert r.status_code == 502 and r.json()["error"]["code"] == "runtime_failed"
        runtime.broken = False
        await runtime.stop("b")  # "b" dies behind the agent's back
        r = await c.post("/v1/sandboxes/b/exec", json={"command": ["true"]}, headers=auth)
        assert r.status_code == 404
    assert agent.sandbox_ids() == ["a"]  # and the agent stopped accounting for it


async def test_exec_timeout_is_reported(make_agent: Callable[..., Agent], clock: ManualClock) -> None:
    async def clock_sleep(seconds: float) -> None:
        clock.advance(seconds)

    agent = make_agent(runtime=SimRuntime(clock, random.Random(0), sleep=clock_sleep))
    await agent.start(StartSandbox(id="a", memory_mb=512))
    out = await agent.exec("a", ExecRequest(command=["sleep", "100"], timeout_s=1.0))
    assert out.timed_out and out.exit_code == 124 and out.duration_ms == 1000.0


async def test_start_passes_the_whole_spec_to_the_runtime(
    make_agent: Callable[..., Agent], runtime: SimRuntime
) -> None:
    agent = make_agent()
    req = StartSandbox(
        id="a",
        memory_mb=768,
        cpus=1.5,
        stateful=True,
        template="python",
        env={"K": "v"},
        hostname="h-a",
        network=True,
    )
    await agent.start(req)
    (handle,) = await runtime.list()
    spec = handle.spec
    assert (spec.id, spec.memory_mb, spec.cpus, spec.stateful, spec.template) == (
        "a",
        768,
        1.5,
        True,
        "python",
    )
    assert (dict(spec.env), spec.hostname, spec.network) == ({"K": "v"}, "h-a", True)
    assert spec.pids == DEFAULT_PIDS  # the runtime's default unless the template says otherwise
    await agent.start(StartSandbox(id="b", memory_mb=512, pids=64))
    assert {h.id: h.spec.pids for h in await runtime.list()}["b"] == 64


class StrictRuntime(SimRuntime):
    """A sim runtime that refuses what the process runtime refuses, and counts OOM kills on demand."""

    kills: dict[str, int]

    async def exec(
        self,
        sandbox_id: str,
        command: Sequence[str],
        *,
        timeout_s: float = 30.0,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> ExecResult:
        if any("=" in key for key in env or {}):
            raise InvalidSandbox("environment variable name is invalid", "env")
        return await super().exec(sandbox_id, command, timeout_s=timeout_s, env=env, cwd=cwd)

    async def start(self, spec: SandboxSpec) -> SandboxHandle:
        if spec.pids < 100:
            raise InvalidSandbox("pids too low for this host", "pids")
        return await super().start(spec)

    async def oom_kills(self, sandbox_id: str) -> int:
        await super().oom_kills(sandbox_id)
        return getattr(self, "kills", {}).get(sandbox_id, 0)


async def test_input_the_runtime_refuses_is_a_422_naming_the_field(
    make_agent: Callable[..., Agent], clock: ManualClock
) -> None:
    agent = make_agent(runtime=StrictRuntime(clock, random.Random(0)))
    await agent.start(StartSandbox(id="a", memory_mb=512))
    auth = {"Authorization": f"Bearer {TOKEN}"}
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(create_app(agent, TOKEN)), base_url="http://a"
    ) as c:
        r = await c.post(
            "/v1/sandboxes/a/exec", json={"command": ["true"], "env": {"A=B": "c"}}, headers=auth
        )
        assert r.status_code == 422, r.text
        assert r.json()["error"]["code"] == "invalid_request"
        assert r.json()["error"]["details"]["field"] == "env"
        r = await c.post("/v1/sandboxes", json={"id": "b", "memory_mb": 512, "pids": 50}, headers=auth)
        assert r.status_code == 422 and r.json()["error"]["details"] == {"field": "pids"}
    assert agent.sandbox_ids() == ["a"] and not agent.refusals  # a refused input is no refusal to count


async def test_oom_kills_reach_the_heartbeat_and_the_counter(
    make_agent: Callable[..., Agent], clock: ManualClock
) -> None:
    runtime = StrictRuntime(clock, random.Random(0))
    agent = make_agent(runtime=runtime)
    for sandbox_id in ("a", "b"):
        await agent.start(StartSandbox(id=sandbox_id, memory_mb=512))
    runtime.kills = {"a": 2}
    hb = await agent.beat()
    assert hb.oom_kills == {"a": 2}  # only the sandboxes that had any
    assert agent.get("a").oom_kills == 2 and agent.get("b").oom_kills == 0
    runtime.kills = {"a": 3, "b": 1}
    assert (await agent.beat()).oom_kills == {"a": 3, "b": 1}
    assert agent.oom_kills_total == 4  # each kill counted once, however many beats saw it
    await agent.stop("a")
    assert (await agent.beat()).oom_kills == {"b": 1} and agent.oom_kills_total == 4


async def test_a_start_at_a_newer_epoch_replaces_the_stale_copy(
    make_agent: Callable[..., Agent], runtime: SimRuntime
) -> None:
    """A host that still runs an old epoch's copy (its fence never reached it) and is then chosen for
    the sandbox's newer epoch runs the new copy, not the old one answered as "already started"."""
    agent = make_agent()
    await agent.start(StartSandbox(id="sb-1", memory_mb=256, cpus=0.5, epoch=0))
    info = await agent.start(StartSandbox(id="sb-1", memory_mb=256, cpus=0.5, epoch=2))
    assert info.epoch == 2
    assert runtime.state.sandboxes["sb-1"].handle.spec.epoch == 2
    assert agent.heartbeat().epochs == {"sb-1": 2}
    # The same epoch again is a retried start; an older one is refused, never run beside it.
    assert (await agent.start(StartSandbox(id="sb-1", memory_mb=256, cpus=0.5, epoch=2))).epoch == 2
    with pytest.raises(AgentConflict):
        await agent.start(StartSandbox(id="sb-1", memory_mb=256, cpus=0.5, epoch=1))
    assert len(runtime.state.sandboxes) == 1
