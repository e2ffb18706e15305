"""The streamed exec's own loop, over real processes (``sh`` on this host, spawned as the runtime's
``spawn`` hands them over): killed at its timeout even while it writes without pause, every byte
delivered to a slow reader after the command has exited, killed when its reader goes away."""

from __future__ import annotations

import asyncio
import os
import signal

from corral.agent.execstream import ExecStream
from corral.exec_result import ExecOutput, ExecResult
from corral.runtime.stream import Spawned


async def _spawn(script: str) -> Spawned:
    proc = await asyncio.create_subprocess_exec(
        "sh",
        "-c",
        script,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
    )
    assert proc.stdout is not None and proc.stderr is not None

    async def wait() -> int:
        code = await proc.wait()
        return 128 - code if code < 0 else code

    def send(sig: int) -> None:
        if proc.returncode is None:
            os.killpg(proc.pid, sig)

    return Spawned(proc.stdout, proc.stderr, None, wait, send)


async def _zero() -> int:
    return 0


def _stream(spawned: Spawned, timeout_s: float, released: list[int]) -> ExecStream:
    return ExecStream(
        spawned, timeout_s, oom_kills=_zero, oom_kills_before=0, release=lambda: released.append(1)
    )


async def test_a_command_writing_without_pause_is_still_killed_at_its_timeout() -> None:
    released: list[int] = []
    stream = _stream(await _spawn("yes"), 0.5, released)
    seen = 0
    async for event in stream.events():
        if isinstance(event, ExecOutput):
            seen += len(event.text)
        elif isinstance(event, ExecResult):
            assert event.timed_out and event.exit_code == 128 + signal.SIGKILL
    assert seen > 0 and released == [1]


async def test_a_slow_reader_gets_every_byte_written_before_the_exit() -> None:
    released: list[int] = []
    # 400 kB, written at once: most of it still on its way (its pipe, the queue) when the command
    # exits, and the reader takes longer than the drain grace over it.
    stream = _stream(await _spawn("yes | head -c 400000"), 30, released)
    got = 0
    async for event in stream.events():
        if isinstance(event, ExecOutput):
            got += len(event.text)
            await asyncio.sleep(0.1)  # a reader on a slow link
        elif isinstance(event, ExecResult):
            assert event.exit_code == 0 and not event.timed_out
    assert got == 400_000 and released == [1]


async def test_closing_before_the_end_kills_the_command() -> None:
    released: list[int] = []
    spawned = await _spawn("echo started; exec sleep 60")
    stream = _stream(spawned, 120, released)
    events = stream.events()
    assert await anext(events) == ExecOutput(stream="stdout", text="started\n")
    await stream.aclose()
    assert await asyncio.wait_for(spawned.wait(), 5) == 128 + signal.SIGKILL
    assert released == [1]
    await stream.aclose()  # idempotent: the slot is handed back once
    assert released == [1]
