"""Background commands at the agent, over real processes (``sh`` on this host, handed over as the
runtime's ``spawn`` hands them): a command outlives the call that started it, holds one of its
sandbox's command slots until it ends (by itself, its timeout, a kill, its sandbox's end), keeps only
the tail of its output with a count of what it dropped, is read at a bounded rate, and is never ended
by a follower that goes away."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pytest

from corral.agent import Agent
from corral.agent.commands import Commands
from corral.agent.errors import AgentBusy, AgentCommandNotFound, AgentSandboxNotFound
from corral.agent.protocol import ExecRequest, StartSandbox
from corral.exec_result import ExecOutput, ExecResult
from corral.runtime.sim import SimRuntime
from corral.runtime.stream import Spawned

SID = "sb-1"


class HostSpawn(SimRuntime):
    """The simulator's sandboxes, whose spawned commands are real processes on this host."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.pids: list[int] = []

    async def spawn(
        self,
        sandbox_id: str,
        command: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        stdin: bool = False,
        user: str | None = None,
    ) -> Spawned:
        self._get(sandbox_id)
        proc = await asyncio.create_subprocess_exec(
            *command,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
        )
        assert proc.stdout is not None and proc.stderr is not None
        self.pids.append(proc.pid)

        async def wait() -> int:
            code = await proc.wait()
            return 128 - code if code < 0 else code

        def send(sig: int) -> None:
            if proc.returncode is None:
                os.killpg(proc.pid, sig)

        return Spawned(proc.stdout, proc.stderr, None, wait, send)


@pytest.fixture
def runtime(clock: Any, sim_state: Any) -> HostSpawn:
    import random

    return HostSpawn(clock, random.Random(7), state=sim_state)


@pytest.fixture
async def agent(make_agent: Callable[..., Agent]) -> Agent:
    a = make_agent(max_execs_per_sandbox=3)
    await a.start(StartSandbox(id=SID, memory_mb=256))
    return a


async def _dies(pid: int, within_s: float = 5.0) -> bool:
    """Whether the process is gone (or a zombie nobody reaped yet) within ``within_s``."""
    end = time.monotonic() + within_s
    while time.monotonic() < end:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X"):
                    return True
        except FileNotFoundError:
            return True
        await asyncio.sleep(0.05)
    return False


def sh(script: str, timeout_s: float = 60.0) -> ExecRequest:
    return ExecRequest(command=["sh", "-c", script], timeout_s=timeout_s)


async def ended(agent: Agent, pid: int, within_s: float = 10.0) -> Any:
    info = await agent.command(SID, pid, wait_s=within_s)
    assert info.state == "ended", info
    return info


async def test_a_command_outlives_the_call_that_started_it(agent: Agent) -> None:
    info = await agent.start_command(SID, sh("sleep 0.3; echo done; echo oops >&2; exit 3"))
    assert info.pid == 1 and info.state == "running" and info.exit_code is None
    assert info.command == ["sh", "-c", "sleep 0.3; echo done; echo oops >&2; exit 3"]
    assert agent.execs.in_flight(SID) == 1  # its slot, held after the call returned
    done = await ended(agent, info.pid)
    assert done.exit_code == 3 and not done.killed and not done.timed_out
    out = agent.command_output(SID, info.pid)
    assert (out.stdout, out.stderr) == ("done\n", "oops\n")
    assert agent.execs.in_flight(SID) == 0
    assert [c.pid for c in agent.list_commands(SID).commands] == [1]


async def test_only_the_tail_of_its_output_is_kept_and_the_rest_counted(agent: Agent) -> None:
    agent.commands = Commands(agent.clock, tail_bytes=1000)
    info = await agent.start_command(
        SID, sh("i=0; while [ $i -lt 500 ]; do echo 123456789; i=$((i+1)); done")
    )
    done = await ended(agent, info.pid)
    assert done.stdout_bytes == 5000 and done.stdout_dropped_bytes == 4000
    out = agent.command_output(SID, info.pid)
    assert out.stdout == "123456789\n" * 100
    result = done.result()
    assert result is not None and result.truncated and result.exit_code == 0


async def test_a_kill_ends_it_and_everything_it_started_and_frees_its_slot(
    agent: Agent, runtime: HostSpawn
) -> None:
    info = await agent.start_command(SID, sh("sleep 60 & sleep 60; wait"))
    killed = await agent.kill_command(SID, info.pid)
    assert killed.state == "ended" and killed.killed and killed.exit_code == 128 + signal.SIGKILL
    assert agent.execs.in_flight(SID) == 0
    assert await _dies(runtime.pids[-1])


async def test_its_own_timeout_ends_it(agent: Agent) -> None:
    info = await agent.start_command(SID, sh("sleep 60", timeout_s=0.3))
    done = await ended(agent, info.pid)
    assert done.timed_out and done.exit_code == 128 + signal.SIGKILL and not done.killed
    assert agent.execs.in_flight(SID) == 0


async def test_past_the_sandbox_bound_a_start_is_refused_until_one_ends(agent: Agent) -> None:
    pids = [(await agent.start_command(SID, sh("sleep 60"))).pid for _ in range(3)]
    with pytest.raises(AgentBusy) as busy:
        await agent.start_command(SID, sh("sleep 60"))
    assert busy.value.status == 429 and busy.value.details["limit"] == 3
    with pytest.raises(AgentBusy):  # a foreground exec shares the same slots
        await agent.exec(SID, ExecRequest(command=["true"]))
    await agent.kill_command(SID, pids[0])
    info = await agent.start_command(SID, sh("sleep 60"))
    assert info.pid == 4
    for pid in (*pids[1:], info.pid):
        await agent.kill_command(SID, pid)


async def test_the_sandbox_s_end_ends_its_commands(agent: Agent, runtime: HostSpawn) -> None:
    info = await agent.start_command(SID, sh("sleep 60"))
    follower = agent.follow_command(SID, info.pid)
    events = follower.events()
    await agent.stop(SID)
    got = [e async for e in events]
    assert isinstance(got[-1], ExecResult) and got[-1].exit_code == 128 + signal.SIGKILL
    await asyncio.sleep(0)
    assert agent.execs.in_flight(SID) == 0
    with pytest.raises(AgentSandboxNotFound):
        agent.list_commands(SID)
    assert await _dies(runtime.pids[-1])


async def test_a_follower_going_away_never_ends_the_command(agent: Agent) -> None:
    info = await agent.start_command(SID, sh("echo one; sleep 0.5; echo two"))
    follower = agent.follow_command(SID, info.pid)
    events = follower.events()
    assert await anext(events) == ExecOutput(stream="stdout", text="one\n")
    await events.aclose()
    await follower.aclose()
    assert (await agent.command(SID, info.pid)).state == "running"
    # A second reader reattaches: what was kept, then the rest, then how it ended.
    again = agent.follow_command(SID, info.pid)
    got = [e async for e in again.events() if e is not None]
    await again.aclose()
    assert got[:-1] == [ExecOutput(stream="stdout", text="one\n"), ExecOutput(stream="stdout", text="two\n")]
    assert isinstance(got[-1], ExecResult) and got[-1].exit_code == 0


async def test_output_nobody_reads_is_read_at_a_bounded_rate(agent: Agent) -> None:
    rate = 256 * 1024
    agent.commands = Commands(
        agent.clock, tail_bytes=64 * 1024, read_rate_bytes_s=rate, read_burst_bytes=rate
    )
    started = time.monotonic()
    info = await agent.start_command(SID, ExecRequest(command=["cat", "/dev/zero"], timeout_s=60))
    await asyncio.sleep(1.0)
    now = (await agent.command(SID, info.pid)).model_copy()
    elapsed = time.monotonic() - started
    assert now.state == "running"
    # What was read: the burst, the rate's worth since, and a chunk in flight; no more.
    assert now.stdout_bytes <= rate + rate * elapsed + 64 * 1024, now
    assert now.stdout_bytes - now.stdout_dropped_bytes <= 64 * 1024
    await agent.kill_command(SID, info.pid)


async def test_a_made_up_pid_is_not_found(agent: Agent) -> None:
    with pytest.raises(AgentCommandNotFound) as missing:
        await agent.command(SID, 42)
    assert missing.value.status == 404 and missing.value.details == {"pid": 42}
    with pytest.raises(AgentSandboxNotFound):
        await agent.start_command("sb-nope", sh("true"))


async def test_only_the_last_few_ended_commands_are_kept(agent: Agent) -> None:
    agent.commands = Commands(agent.clock, max_ended=2)
    for _ in range(4):
        info = await agent.start_command(SID, sh("true"))
        await ended(agent, info.pid)
    assert [c.pid for c in agent.list_commands(SID).commands] == [3, 4]


async def test_over_the_agent_s_http_api(agent: Agent) -> None:
    import httpx

    from corral.agent.client import HttpAgentClient
    from corral.agent.http import create_app

    client = HttpAgentClient(
        "http://agent.test",
        "host-key-0123456789",
        transport=httpx.ASGITransport(create_app(agent, "host-key-0123456789")),
    )
    try:
        info = await client.start_command(SID, sh("echo hi; sleep 0.2; echo bye >&2"), epoch=0)
        assert info.state == "running"
        stream = await client.follow_command(SID, info.pid, epoch=0)
        got = [e async for e in stream.events() if e is not None]
        await stream.aclose()
        assert got[0] == ExecOutput(stream="stdout", text="hi\n") and isinstance(got[-1], ExecResult)
        done = await client.command(SID, info.pid, wait_s=5)
        assert done.state == "ended" and done.exit_code == 0
        out = await client.command_output(SID, info.pid)
        assert (out.stdout, out.stderr) == ("hi\n", "bye\n")
        assert [c.pid for c in (await client.list_commands(SID)).commands] == [info.pid]
        slow = await client.start_command(SID, sh("sleep 60"))
        assert (await client.kill_command(SID, slow.pid)).killed
        with pytest.raises(AgentCommandNotFound):
            await client.command(SID, 99)
        with pytest.raises(AgentSandboxNotFound) as gone:
            await client.list_commands("sb-nope")
        assert not isinstance(gone.value, AgentCommandNotFound)
    finally:
        await client.aclose()
