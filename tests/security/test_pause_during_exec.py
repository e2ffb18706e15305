"""A tenant that pauses its sandbox under a running exec must not hold the call, nor leave the host a
task blocked in a frozen cgroup: the exec ends at its timeout, saying the sandbox was paused, and its
launcher is reaped once the sandbox thaws or stops. An exec on a paused sandbox is the caller's state,
answered 409 ``sandbox_paused``, never a 5xx."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from corral.client import AsyncCorral, SandboxPaused
from corral.exec_result import ExecResult
from corral.runtime.base import SandboxSpec
from corral.runtime.process import ProcessRuntime
from corral.runtime.statedir import Running
from tests.runtime.conftest import (  # noqa: F401
    _eventually,
    cgroup_root,
    make_process_runtime,
    process_runtime,
)

from .conftest import ADMIN, Cluster

TIMEOUT_S = 2.0
DEADLINE_S = TIMEOUT_S + 10.0  # only stops a hang; before the fix the call never returned
MARK = "sleep 7777"


def _procs(rt: ProcessRuntime, sid: str) -> set[int]:
    record = rt.statedir.load(sid)
    assert isinstance(record, Running) and record.cgroup is not None
    return set(map(int, (Path(record.cgroup) / "cgroup.procs").read_text().split()))


def _gone(pids: set[int]) -> bool:
    """None of ``pids`` is left, not even as a zombie."""
    return not any(Path(f"/proc/{pid}").exists() for pid in pids)


async def _paused_mid_exec(rt: ProcessRuntime, sid: str) -> tuple[asyncio.Task[ExecResult], set[int]]:
    """An exec of a long command, its sandbox paused once the command runs; with the host pids of the
    exec's processes (what the init started through the guest channel), frozen in the sandbox's cgroup
    with the init: the command's SIGKILL at its timeout waits in the channel until the sandbox thaws."""
    handle = await rt.start(SandboxSpec(id=sid, memory_mb=128))
    init = int(handle.ref.split()[0].removeprefix("pid="))
    skeleton = _procs(rt, sid)
    command = ["sh", "-c", f"touch /tmp/began; {MARK}"]
    exec_ = asyncio.create_task(rt.exec(sid, command, timeout_s=TIMEOUT_S))
    began = Path(f"/proc/{init}/root/tmp/began")

    async def running() -> bool:
        # sh and sleep, which the init started (or the launcher, also in the cgroup, without the channel)
        return began.exists() and len(_procs(rt, sid) - skeleton) >= 2

    assert await _eventually(running)
    await rt.pause(sid)
    return exec_, _procs(rt, sid) - skeleton


async def _ends_at_its_timeout(exec_: asyncio.Task[ExecResult]) -> None:
    result = await asyncio.wait_for(exec_, DEADLINE_S)
    assert result.timed_out and result.exit_code == 137
    assert result.note is not None and "paused" in result.note


# The frozen commands are found and watched as host processes in the sandbox's cgroup.
_HOST_PROCESSES = pytest.mark.process_only("a command inside gVisor is the Sentry's task, no host process")


@_HOST_PROCESSES
@pytest.mark.usefixtures("runtime_name")
async def test_pause_during_exec_ends_it_at_its_timeout_and_resume_cleans_up(
    process_runtime: ProcessRuntime,  # noqa: F811
) -> None:
    exec_, frozen = await _paused_mid_exec(process_runtime, "paused-exec")
    await _ends_at_its_timeout(exec_)
    assert not _gone(frozen)  # still frozen, with their SIGKILL pending
    await process_runtime.resume("paused-exec")

    async def reaped() -> bool:
        return _gone(frozen)

    assert await _eventually(reaped)  # killed and reaped once thawed: no zombie, nothing blocked
    left = await process_runtime.exec("paused-exec", ["sh", "-c", "ps -eo args"])
    assert left.exit_code == 0 and MARK not in left.stdout


@_HOST_PROCESSES
@pytest.mark.usefixtures("runtime_name")
async def test_stop_while_paused_during_exec_leaves_nothing(
    process_runtime: ProcessRuntime,  # noqa: F811
) -> None:
    exec_, frozen = await _paused_mid_exec(process_runtime, "stopped-exec")
    record = process_runtime.statedir.load("stopped-exec")
    assert isinstance(record, Running) and record.cgroup is not None
    await _ends_at_its_timeout(exec_)
    await process_runtime.stop("stopped-exec")

    async def reaped() -> bool:
        return _gone(frozen)

    assert await _eventually(reaped)
    assert not Path(record.cgroup).exists()
    assert await process_runtime.list() == []


async def _sandbox_on_a_paused_host(c: Cluster) -> str:
    r = await c.http.post("/v1/sandboxes", json={"memory_mb": 256}, headers=c.as_(ADMIN))
    assert r.status_code == 201, r.text
    sid = str(r.json()["id"])
    (agent,) = [a for a in c.fleet.agents if sid in a.sandbox_ids()]
    await agent.pause(sid)
    return sid


async def test_exec_on_a_paused_sandbox_is_a_409(cluster: Cluster) -> None:
    sid = await _sandbox_on_a_paused_host(cluster)
    r = await cluster.http.post(
        f"/v1/sandboxes/{sid}/exec", json={"command": ["true"]}, headers=cluster.as_(ADMIN)
    )
    assert r.status_code == 409, r.text
    assert r.json()["error"]["code"] == "sandbox_paused"
    transport = httpx.ASGITransport(app=cluster.http._transport.app)  # type: ignore[attr-defined]
    async with AsyncCorral("http://corral.test", ADMIN, transport=transport) as sdk:
        with pytest.raises(SandboxPaused) as raised:
            await sdk.sandboxes.exec(sid, ["true"])
    assert raised.value.status == 409 and not raised.value.retryable
