"""The unmodified e2b SDK's terminals (``sandbox.pty``) and directory watches (``files.watch_dir``,
polled by the sync SDK, streamed by the async one) against corral's process runtime."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable

import pytest
from e2b import AsyncSandbox, CommandExitException, Sandbox
from e2b.exceptions import InvalidArgumentException, NotFoundException
from e2b.sandbox.commands.command_handle import PtySize
from e2b.sandbox.filesystem.watch_handle import FilesystemEvent, FilesystemEventType

pytestmark = pytest.mark.timeout(120)


def eventually(probe: Callable[[], bool], within_s: float = 30.0) -> bool:
    """Poll until ``probe`` holds; the bound only keeps a broken test from hanging."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if probe():
            return True
        time.sleep(0.05)
    return probe()


async def seen_soon(seen: list[FilesystemEvent], wanted: tuple[str, FilesystemEventType]) -> bool:
    for _ in range(600):  # bounded: a broken test ends instead of hanging
        if wanted in {(e.name, e.type) for e in seen}:
            return True
        await asyncio.sleep(0.05)
    return False


class Screen:
    """What a terminal showed, gathered by a thread that waits on the handle."""

    def __init__(self, handle: object) -> None:
        self.data = bytearray()
        self.outcome: list[object] = []

        def follow() -> None:
            try:
                self.outcome.append(handle.wait(on_pty=self.data.extend))  # type: ignore[attr-defined]
            except Exception as exc:
                self.outcome.append(exc)

        self.thread = threading.Thread(target=follow, daemon=True)
        self.thread.start()

    def text(self) -> str:
        return bytes(self.data).decode(errors="replace")

    def shows(self, needle: str) -> bool:
        return eventually(lambda: needle in self.text())


def test_a_terminal_runs_a_shell_resizes_and_is_killed(sandbox: Sandbox) -> None:
    handle = sandbox.pty.create(PtySize(rows=24, cols=80), envs={"PS1": "$ "})
    screen = Screen(handle)
    sandbox.pty.send_stdin(handle.pid, b"echo hi-$((6*7)); tty; stty size; echo owner=$(stat -c %U $(tty))\n")
    assert screen.shows("hi-42"), screen.text()
    assert screen.shows("/dev/pts/"), screen.text()  # a terminal of the sandbox's own devpts
    assert screen.shows("24 80"), screen.text()
    assert screen.shows("owner=user"), screen.text()  # the terminal is its user's, as a login's is
    sandbox.pty.resize(handle.pid, PtySize(rows=33, cols=101))
    sandbox.pty.send_stdin(handle.pid, b"stty size; echo $TERM\n")
    assert screen.shows("33 101"), screen.text()
    assert screen.shows("xterm-256color"), screen.text()
    # The shell is a session leader with the terminal as its controlling one: job control works.
    sandbox.pty.send_stdin(handle.pid, b"sleep 300 & jobs; ps -o stat= -p $$\n")
    assert screen.shows("[1]"), screen.text()
    assert eventually(lambda: "s" in screen.text().split("jobs; ps -o stat= -p $$")[-1])
    assert sandbox.pty.kill(handle.pid)
    screen.thread.join(30)
    (outcome,) = screen.outcome
    # As E2B: a killed terminal's wait raises with the signal as its error.
    assert isinstance(outcome, CommandExitException), outcome
    assert outcome.exit_code == -1 and "killed" in (outcome.error or "")
    assert not sandbox.pty.kill(handle.pid)  # gone, as E2B answers for an unknown pid
    # Nothing of it is left running in the sandbox (its background job had the hangup).
    assert eventually(lambda: sandbox.commands.run("pgrep -x sleep || true").stdout == "")


def test_a_terminal_that_exits_ends_its_wait(sandbox: Sandbox) -> None:
    handle = sandbox.pty.create(PtySize(rows=10, cols=40))
    screen = Screen(handle)
    # A background job still holds the terminal when the shell exits: the wait ends all the same.
    sandbox.pty.send_stdin(handle.pid, b"sleep 300 & exit 0\n")
    screen.thread.join(30)
    (outcome,) = screen.outcome
    assert not isinstance(outcome, Exception), outcome
    assert outcome.exit_code == 0  # type: ignore[attr-defined]


def test_a_polled_watch_sees_what_a_command_does(sandbox: Sandbox) -> None:
    sandbox.files.make_dir("/home/user/watched")
    watch = sandbox.files.watch_dir("/home/user/watched")
    sandbox.commands.run("touch /home/user/watched/new && echo x >> /home/user/watched/new")
    sandbox.commands.run(
        "chmod 600 /home/user/watched/new && mv /home/user/watched/new /home/user/watched/moved"
    )
    sandbox.commands.run("rm /home/user/watched/moved; mkdir -p /home/user/watched/sub/deeper")
    seen: list[FilesystemEvent] = []
    wanted = {
        ("new", FilesystemEventType.CREATE),
        ("new", FilesystemEventType.WRITE),
        ("new", FilesystemEventType.CHMOD),
        ("new", FilesystemEventType.RENAME),
        ("moved", FilesystemEventType.CREATE),
        ("moved", FilesystemEventType.REMOVE),
        ("sub", FilesystemEventType.CREATE),
    }
    assert eventually(
        lambda: seen.extend(watch.get_new_events()) or wanted <= {(e.name, e.type) for e in seen}
    )
    # Not recursive: what happens under sub is not this watch's.
    assert not [e for e in seen if e.name.startswith("sub/")]
    watch.stop()
    with pytest.raises(Exception, match=r"(?i)already stopped"):
        watch.get_new_events()


async def test_a_streamed_recursive_watch_sees_deeper_directories(sandbox: Sandbox) -> None:
    remote = await AsyncSandbox.connect(sandbox.sandbox_id)
    await remote.files.make_dir("/tmp/tree")
    seen: list[FilesystemEvent] = []
    watch = await remote.files.watch_dir("/tmp/tree", seen.append, recursive=True)
    try:
        await remote.commands.run("mkdir /tmp/tree/a")
        # The helper watches a new directory before it reports it: once "a" is seen, so is what is in it.
        assert await seen_soon(seen, ("a", FilesystemEventType.CREATE))
        await remote.commands.run("touch /tmp/tree/a/leaf")
        assert await seen_soon(seen, ("a/leaf", FilesystemEventType.CREATE))
    finally:
        await watch.stop()


def test_watching_what_is_not_a_directory_raises_as_e2b(sandbox: Sandbox) -> None:
    with pytest.raises(NotFoundException):
        sandbox.files.watch_dir("/home/user/not-there")
    sandbox.files.write("/home/user/plain.txt", "x")
    with pytest.raises(InvalidArgumentException):
        sandbox.files.watch_dir("/home/user/plain.txt")
