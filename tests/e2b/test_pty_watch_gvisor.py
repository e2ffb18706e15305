"""The e2b SDK's terminals and directory watches on ``corral serve --runtime gvisor``, in one test (a
gVisor server takes seconds to start): a watch works as on the process runtime (its helper runs inside
gVisor, whose own inotify sees the guest's files); a terminal is a host one handed to the Sentry, so
sizes, typed input, ^C and kill behave as on the process runtime. And a networked sandbox's port
answers from its network slot."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from e2b import CommandExitException, Sandbox
from e2b.sandbox.commands.command_handle import PtySize
from e2b.sandbox.filesystem.watch_handle import FilesystemEventType

from corral.testing.portserver import start_argv
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


def test_a_gvisor_sandbox_serves_a_port_from_its_network_slot(serve: Serve) -> None:
    """A networked gVisor sandbox gets its own slot: a server inside answers through the API's port
    route; a sandbox created without a network has no port anyone can reach."""
    sid = serve.create(network={"mode": "internet"})
    try:
        started = serve.exec(sid, start_argv(8000), timeout_s=30)
        assert started["stdout"].strip() == "listening", started
        r = serve.tenant.get(f"/v1/sandboxes/{sid}/ports/8000/hello/gvisor", timeout=30)
        assert r.status_code == 200, r.text
        assert r.text.startswith("hello /hello/gvisor "), r.text
        inside = serve.exec(sid, ["cat", "/proc/net/dev"])["stdout"]
        assert "eth0" in inside, inside  # the slot's interface, seen through gVisor
    finally:
        serve.delete(sid)
    offline = serve.create()
    try:
        r = serve.tenant.get(f"/v1/sandboxes/{offline}/ports/8000/", timeout=30)
        assert r.status_code == 409 and r.json()["error"]["code"] == "network_not_attached", r.text
    finally:
        serve.delete(offline)
