"""Floods of output nobody reads must not cost the host: reading a pipe is the agent's CPU, outside
every sandbox's limit. An exec keeps its first bytes, drops a bounded amount more, then closes the
pipe on the writer (SIGPIPE, as under ``cmd | head``); a streamed command nobody listens to has its
pipes left full once a bounded amount was dropped, so it blocks on its next write until a client
attaches again. Each attack runs ``cat /dev/zero`` in a real sandbox."""

from __future__ import annotations

import asyncio
import json
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from corral.agent.agent import Agent
from corral.agent.config import AgentConfig
from corral.agent.envd import SANDBOX_HEADER, UNHEARD_BYTES, Envd
from corral.agent.envd.connect import envelope
from corral.agent.protocol import StartSandbox
from corral.runtime.base import Runtime, SandboxSpec
from corral.runtime.capture import DEFAULT_LIMIT, DROP_BUDGET
from tests.runtime.conftest import _eventually

pytestmark = pytest.mark.process

SID = "flooded"
FLOODS = 5
# What a command reads past its bound at most: the chunks already in flight when a listener leaves.
SLACK = 1024 * 1024
_SIGPIPE_EXIT = 128 + 13
# gVisor's kernel answers a write to a closed host pipe with EPIPE but no SIGPIPE: cat says so, exits 1.
_EPIPE_EXIT = {"process": _SIGPIPE_EXIT, "gvisor": 1}
# The flood processes inside the sandbox, by pid: their state and the bytes they have written.
_WATCH = """
import json, os
found = {}
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        if open(f"/proc/{pid}/comm").read().strip() != "cat":
            continue
        stat = open(f"/proc/{pid}/stat").read()
        io = dict(line.split(": ") for line in open(f"/proc/{pid}/io").read().splitlines())
    except OSError:
        continue
    found[pid] = [stat.rsplit(")", 1)[1].split()[0], int(io["wchar"])]
print(json.dumps(found))
"""


@pytest.fixture
async def envd(sandbox_runtime: Runtime) -> AsyncIterator[Envd]:
    agent = Agent(
        AgentConfig("host-1", 4096, 2.0, address="http://127.0.0.1:1"), sandbox_runtime, pressure=lambda: 0.0
    )
    await agent.start(StartSandbox(id=SID, memory_mb=256))
    envd = Envd(agent)
    yield envd
    runs = list(envd._runs.get(SID, {}).values())
    await agent.stop(SID)
    # Every command ends with its sandbox, the ones held back by their bound included.
    await asyncio.wait_for(asyncio.gather(*(run.ended.wait() for run in runs)), 10)
    await asyncio.gather(*(task for run in runs for task in run.tasks))


class Stream:
    """One server stream, driven through the ASGI app by hand so the client can stop reading (its
    ``send`` blocks, as a full socket's would) or go away (``http.disconnect``)."""

    def __init__(
        self,
        envd: Envd,
        method: str,
        message: dict[str, Any],
        headers: dict[str, str] | None = None,
        *,
        hold: bool = False,
    ) -> None:
        """``hold``: read the first event only, then stop reading (a client gone quiet)."""
        self.events: list[dict[str, Any]] = []
        self.reading = asyncio.Event()
        self.reading.set()
        self.started = asyncio.Event()
        self._gone = asyncio.Event()
        self._buffer = bytearray()
        body = envelope(message)
        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": "POST",
            "scheme": "http",
            "path": f"/process.Process/{method}",
            "raw_path": f"/process.Process/{method}".encode(),
            "query_string": b"",
            "root_path": "",
            "headers": [
                (SANDBOX_HEADER.encode(), SID.encode()),
                (b"content-type", b"application/connect+json"),
                *((k.encode(), v.encode()) for k, v in (headers or {}).items()),
            ],
            "client": ("127.0.0.1", 1),
            "server": ("envd", 80),
        }
        requested = False

        async def receive() -> dict[str, Any]:
            nonlocal requested
            if not requested:
                requested = True
                return {"type": "http.request", "body": body, "more_body": False}
            await self._gone.wait()
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            if message["type"] != "http.response.body":
                return
            await self.reading.wait()
            self._buffer += message.get("body", b"")
            while len(self._buffer) >= 5:
                (length,) = struct.unpack_from(">I", self._buffer, 1)
                if len(self._buffer) < 5 + length:
                    break
                self.events.append(json.loads(self._buffer[5 : 5 + length]))
                del self._buffer[: 5 + length]
                self.started.set()
                if hold:
                    self.reading.clear()

        self.task = asyncio.create_task(envd(scope, receive, send))

    @property
    def pid(self) -> int:
        pid: int = self.events[0]["event"]["start"]["pid"]
        return pid

    def data_events(self) -> int:
        return sum("data" in e.get("event", {}) for e in self.events)

    async def disconnect(self) -> None:
        self._gone.set()
        await asyncio.wait_for(self.task, 10)


async def settled(read: Callable[[], Awaitable[Any]], every_s: float = 0.5) -> Any:
    """``read()`` once two readings ``every_s`` apart agree; the bound only stops a broken test."""
    last = await read()
    for _ in range(60):
        await asyncio.sleep(every_s)
        now = await read()
        if now == last:
            return now
        last = now
    raise AssertionError(f"still moving: {last}")


@pytest.mark.gvisor_subset
async def test_an_exec_flood_is_cut_off_with_sigpipe(sandbox_runtime: Runtime, runtime_name: str) -> None:
    await sandbox_runtime.start(SandboxSpec(id="exec-flood", memory_mb=128))
    result = await sandbox_runtime.exec("exec-flood", ["cat", "/dev/zero"], timeout_s=60)
    # Ended by the closed pipe, long before its timeout: nothing drains it for the rest of a minute.
    assert not result.timed_out
    assert result.exit_code == _EPIPE_EXIT[runtime_name]
    assert result.truncated and len(result.stdout) == DEFAULT_LIMIT
    if runtime_name == "gvisor":
        # No SIGPIPE, so no note of the cut: the command's own EPIPE error says it.
        assert "Broken pipe" in result.stderr and result.note is None, result
    else:
        assert result.note is not None and "stdout was cut off" in result.note
        assert str(DEFAULT_LIMIT + DROP_BUDGET) in result.note  # what was read, the bound exactly
    # The same on stderr, with the stream that was not flooded kept whole; the sandbox works on.
    result = await sandbox_runtime.exec(
        "exec-flood", ["sh", "-c", "echo fine; cat /dev/zero >&2"], timeout_s=60
    )
    assert (result.exit_code, result.stdout, result.timed_out) == (_EPIPE_EXIT[runtime_name], "fine\n", False)
    assert runtime_name == "gvisor" or (result.note is not None and "stderr was cut off" in result.note)
    assert (await sandbox_runtime.exec("exec-flood", ["echo", "ok"])).stdout == "ok\n"


async def watch(sandbox_runtime: Runtime) -> dict[str, list[Any]]:
    r = await sandbox_runtime.exec(SID, ["python3", "-I", "-c", _WATCH])
    assert r.exit_code == 0, r.stderr
    found: dict[str, list[Any]] = json.loads(r.stdout)
    return found


async def test_background_floods_nobody_reads_stop_costing_the_agent(
    envd: Envd, sandbox_runtime: Runtime, runtime_name: str
) -> None:
    streams = []
    for _ in range(FLOODS):
        stream = Stream(envd, "Start", {"process": {"cmd": "cat", "args": ["/dev/zero"]}}, hold=True)
        await asyncio.wait_for(stream.started.wait(), 10)
        await stream.disconnect()  # started, then gone: nobody will read its output
        streams.append(stream)
    # Once each command's unheard bound is reached, the agent reads nothing more of it...
    read = await settled(lambda: asyncio.sleep(0, envd.output_bytes_read))
    assert FLOODS * UNHEARD_BYTES <= read <= FLOODS * (UNHEARD_BYTES + SLACK)
    await asyncio.sleep(1.0)
    assert envd.output_bytes_read == read
    # ...and the floods stand blocked on their full pipes, writing nothing (their own count).
    floods = await settled(lambda: watch(sandbox_runtime))
    assert len(floods) == FLOODS
    assert {state for state, _written in floods.values()} == {"S"}
    assert sum(written for _state, written in floods.values()) <= read + FLOODS * SLACK

    # A client that attaches again gets the output flowing, from where it stood.
    again = Stream(envd, "Connect", {"process": {"pid": streams[0].pid}})
    await asyncio.wait_for(again.started.wait(), 10)

    async def flowing() -> bool:
        return again.data_events() >= 3

    assert await _eventually(flowing)
    assert envd.output_bytes_read > read
    await again.disconnect()
    # Alone again: it stops at its bound once more.
    reread = await settled(lambda: asyncio.sleep(0, envd.output_bytes_read))
    assert reread <= read + again.data_events() * SLACK + UNHEARD_BYTES + SLACK


async def test_a_slow_reader_holds_the_command_back_not_the_agents_memory(
    envd: Envd, runtime_name: str
) -> None:
    stream = Stream(envd, "Start", {"process": {"cmd": "cat", "args": ["/dev/zero"]}}, hold=True)
    await asyncio.wait_for(stream.started.wait(), 10)  # attached, then reads nothing: a full socket
    read = await settled(lambda: asyncio.sleep(0, envd.output_bytes_read))
    # The queue of the stream and the pipe hold the command back: a few chunks, never a flood.
    assert read <= UNHEARD_BYTES
    stream.reading.set()
    await stream.disconnect()


async def test_a_stream_ends_at_its_deadline_while_paused_and_a_paused_sandbox_starts_nothing(
    envd: Envd,
) -> None:
    sleeper = {"process": {"cmd": "sleep", "args": ["600"]}}
    stream = Stream(envd, "Start", sleeper, headers={"connect-timeout-ms": "1500"})
    await asyncio.wait_for(stream.started.wait(), 10)
    await envd.agent.pause(SID)
    await asyncio.wait_for(stream.task, 10)  # only a bound against a hang
    assert stream.events[-1].get("error", {}).get("code") == "deadline_exceeded", stream.events[-3:]
    refused = Stream(envd, "Start", sleeper)
    await asyncio.wait_for(refused.task, 10)
    error = refused.events[-1]["error"]
    assert error["code"] == "failed_precondition" and "paused" in error["message"]
    await envd.agent.resume(SID)
