"""The e2b SDK's terminals and directory watches on ``corral serve --runtime gvisor``, in one test (a
gVisor server takes seconds to start): a watch works as on the process runtime (its helper runs inside
gVisor, whose own inotify sees the guest's files); a terminal is a host one handed to the Sentry, so
sizes, typed input, ^C and kill behave as on the process runtime."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from e2b import CommandExitException, Sandbox
from e2b.sandbox.commands.command_handle import PtySize
from e2b.sandbox.filesystem.watch_handle import FilesystemEventType

from tests.e2b.test_pty_watch import Screen, eventually
from tests.security.runtime_serve import Serve, running_serve

pytestmark = [pytest.mark.process, pytest.mark.timeout(180)]


@pytest.fixture(scope="module")
def serve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Serve]:
    yield from running_serve(tmp_path_factory, runtime="gvisor", hosts=1)


def test_a_watch_and_a_terminal_on_gvisor(serve: Serve, monkeypatch: pytest.MonkeyPatch) -> None:
    url = str(serve.tenant.base_url).rstrip("/")
    monkeypatch.setenv("E2B_API_URL", url)
    monkeypatch.setenv("E2B_SANDBOX_URL", url)
    monkeypatch.setenv("E2B_API_KEY", serve.tenant.headers["Authorization"].removeprefix("Bearer "))
    sandbox = Sandbox.create()
    try:
        sandbox.files.make_dir("/tmp/seen")
        watch = sandbox.files.watch_dir("/tmp/seen")
        sandbox.commands.run("touch /tmp/seen/made-in-gvisor")
        events: list[tuple[str, FilesystemEventType]] = []
        assert eventually(
            lambda: (
                events.extend((e.name, e.type) for e in watch.get_new_events()) is None
                and ("made-in-gvisor", FilesystemEventType.CREATE) in events
            )
        ), events
        watch.stop()
        handle = sandbox.pty.create(PtySize(rows=24, cols=80), envs={"PS1": "$ "})
        screen = Screen(handle)
        sandbox.pty.send_stdin(handle.pid, b"echo hi-$((6*7)); stty size\n")
        assert screen.shows("hi-42") and screen.shows("24 80"), screen.text()
        sandbox.pty.resize(handle.pid, PtySize(rows=33, cols=101))
        sandbox.pty.send_stdin(handle.pid, b"sleep 300\n")
        assert eventually(lambda: sandbox.commands.run("pgrep -x sleep || true").stdout != "")
        sandbox.pty.send_stdin(handle.pid, b"\x03")  # ^C ends the sleep, not the shell
        assert eventually(lambda: sandbox.commands.run("pgrep -x sleep || true").stdout == "")
        sandbox.pty.send_stdin(handle.pid, b"stty size\n")
        assert screen.shows("33 101"), screen.text()
        sandbox.pty.send_stdin(handle.pid, b"sleep 301 & jobs\n")
        assert screen.shows("[1]"), screen.text()  # job control: the shell has the terminal
        assert sandbox.pty.kill(handle.pid)
        screen.thread.join(30)
        (outcome,) = screen.outcome
        assert isinstance(outcome, CommandExitException), outcome
        assert outcome.exit_code == -1 and "killed" in (outcome.error or "")
        assert sandbox.commands.run("echo ok").stdout == "ok\n"
    finally:
        sandbox.kill()
