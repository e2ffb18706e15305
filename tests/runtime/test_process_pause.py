"""Pause and resume on the process runtime: the cgroup freezer stops every process where it stands,
memory and all, and lets it go on from there."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from corral.runtime.base import SandboxPaused, SandboxSpec
from corral.runtime.process import ProcessRuntime

pytestmark = pytest.mark.process


async def test_a_paused_sandbox_stands_still_and_resumes(
    process_runtime: ProcessRuntime, eventually: Callable[..., Awaitable[bool]]
) -> None:
    handle = await process_runtime.start(SandboxSpec(id="frozen", memory_mb=128))
    loop = "i=0; while true; do i=$((i+1)); echo $i > /tmp/count; done"
    spawned = await process_runtime.spawn("frozen", ["sh", "-c", loop])
    init = int(handle.ref.split()[0].removeprefix("pid="))
    count = Path(f"/proc/{init}/root/tmp/count")

    def read() -> int:
        # The loop truncates the file before each write, so a read often finds it empty: read until
        # a number shows (a sandbox frozen between truncate and write keeps it empty: 0 then).
        for _ in range(2000):
            try:
                value = int(count.read_text() or 0)
            except (OSError, ValueError):
                value = 0
            if value:
                return value
        return 0

    async def counting() -> bool:
        first = read()
        await asyncio.sleep(0.05)
        return read() > first > 0

    assert await eventually(counting)
    await process_runtime.pause("frozen")
    assert process_runtime.paused("frozen")
    stood = read()
    await asyncio.sleep(0.3)
    assert read() == stood  # frozen: not one more iteration
    with pytest.raises(SandboxPaused):
        await process_runtime.exec("frozen", ["true"])
    await process_runtime.resume("frozen")
    assert not process_runtime.paused("frozen")

    async def moved_on() -> bool:
        return read() > stood

    assert await eventually(moved_on)
    await process_runtime.pause("frozen")
    await process_runtime.stop("frozen")  # a paused sandbox stops at once, leaving nothing behind
    assert await spawned.wait() == 128 + 9


async def test_a_reboot_ends_every_process_but_init_and_keeps_the_files(
    process_runtime: ProcessRuntime, eventually: Callable[..., Awaitable[bool]]
) -> None:
    await process_runtime.start(SandboxSpec(id="reboot", memory_mb=128))
    # A command that outlives its caller (setsid, its own session), and one still waited for.
    kept = await process_runtime.exec("reboot", ["sh", "-c", "echo kept > /tmp/f; setsid sleep 300 &"])
    assert kept.exit_code == 0
    waited = await process_runtime.spawn("reboot", ["sleep", "300"])

    async def both_sleep() -> bool:
        return (await process_runtime.exec("reboot", ["pgrep", "-c", "sleep"])).stdout == "2\n"

    assert await eventually(both_sleep)  # the command has joined the sandbox's cgroup
    await process_runtime.pause("reboot")
    await process_runtime.reboot("reboot")  # frozen it was, frozen it stays
    assert process_runtime.paused("reboot")
    assert await asyncio.wait_for(waited.wait(), 5) == 128 + 9
    await process_runtime.resume("reboot")
    found = await process_runtime.exec("reboot", ["cat", "/tmp/f"])
    assert found.stdout == "kept\n"

    async def none_sleeps() -> bool:  # the init reaps the one it inherited, once thawed
        return (await process_runtime.exec("reboot", ["pgrep", "-c", "sleep"])).stdout == "0\n"

    assert await eventually(none_sleeps)
    await process_runtime.reboot("reboot")  # a running one is rebooted in place and goes on running
    assert not process_runtime.paused("reboot")
    assert (await process_runtime.exec("reboot", ["cat", "/tmp/f"])).stdout == "kept\n"
    await process_runtime.stop("reboot")
