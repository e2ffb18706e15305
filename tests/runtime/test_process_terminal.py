"""A command on a terminal in a process sandbox: it leads a session of its own there, so the
terminal's signals (typed ^C, a resize's SIGWINCH) reach the tenant's processes and never the
host-side launcher, and a signal to the command reaches everything on its terminal."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

from corral.runtime.base import InvalidSandbox, SandboxPaused, SandboxSpec
from corral.runtime.process import ProcessRuntime
from corral.runtime.stream import PtySize, Spawned
from tests.runtime.conftest import cgroup_root, make_process_runtime, process_runtime  # noqa: F401

pytestmark = pytest.mark.process


async def typed(spawned: Spawned, keys: bytes, shown: bytearray, until: bytes) -> None:
    assert spawned.stdin is not None
    spawned.stdin.write(keys)
    await spawned.stdin.drain()
    while until not in shown:  # the test's timeout ends a wait that never comes
        chunk = await spawned.stdout.read(4096)
        assert chunk, bytes(shown)
        shown += chunk


async def running(runtime: ProcessRuntime, argument: str, expected: bool = True) -> bool:
    """Whether a ``sleep <argument>`` runs in the sandbox, once it is as ``expected`` (or never)."""
    for _ in range(400):  # bounded: a broken test ends instead of hanging
        listed = await runtime.exec("tty-1", ["pgrep", "-a", "-x", "sleep"])
        found = f"sleep {argument}" in listed.stdout
        if found == expected:
            return found
        await asyncio.sleep(0.05)
    return found


async def test_the_terminal_s_signals_are_the_tenant_s(process_runtime: ProcessRuntime) -> None:  # noqa: F811
    await process_runtime.start(SandboxSpec(id="tty-1", memory_mb=128))
    shell = await process_runtime.spawn("tty-1", ["sh"], stdin=True, pty=PtySize(rows=20, cols=60))
    shown = bytearray()
    await typed(shell, b"trap 'echo winched' WINCH; sleep 300 & echo bg=$!; tty\n", shown, b"/dev/pts/")
    # ^C typed ends the foreground command, not the shell, and not the launcher that waits for it.
    await typed(shell, b"sleep 200\n", shown, b"sleep 200")
    assert await running(process_runtime, "200")
    await typed(shell, b"\x03", shown, b"^C")
    assert not await running(process_runtime, "200", expected=False)
    await typed(shell, b"echo still-$((1+1))\n", shown, b"still-2")
    assert shell.resize is not None
    shell.resize(PtySize(rows=30, cols=90))
    await typed(shell, b"stty size\n", shown, b"30 90")
    assert b"winched" in shown  # the resize's SIGWINCH reached the shell
    # A kill reaches everything on the terminal: the shell and its background job.
    shell.signal(signal.SIGKILL)
    assert await shell.wait() == 128 + signal.SIGKILL
    assert not await running(process_runtime, "300", expected=False)  # the background job too
    await process_runtime.stop("tty-1")


async def test_a_refused_terminal_leaves_no_descriptor(process_runtime: ProcessRuntime) -> None:  # noqa: F811
    await process_runtime.start(SandboxSpec(id="tty-2", memory_mb=128))
    before = len(os.listdir("/proc/self/fd"))
    with pytest.raises(InvalidSandbox):
        await process_runtime.spawn("tty-2", ["sh"], env={"BAD NAME": "x"}, pty=PtySize(5, 5))
    with pytest.raises(InvalidSandbox):
        await process_runtime.spawn("tty-2", ["sh"], pty=PtySize(0, 5))
    await process_runtime.pause("tty-2")
    with pytest.raises(SandboxPaused):
        await process_runtime.spawn("tty-2", ["sh"], pty=PtySize(5, 5))
    await process_runtime.resume("tty-2")
    assert len(os.listdir("/proc/self/fd")) == before
    await process_runtime.stop("tty-2")
