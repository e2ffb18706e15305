"""E2B's lifecycle through the unmodified SDK against a real ``corral serve``: a timeout that pauses
(with the memory kept, or the files alone: the next start a reboot) instead of killing, a sandbox that
auto-resumes on its next data-plane call or waits for an explicit connect, and a timeout that kills."""

from __future__ import annotations

import datetime
import time
from collections.abc import Callable

import pytest
from e2b import NotFoundException, Sandbox, SandboxState
from e2b.exceptions import SandboxNotRunningException

from tests.e2b.conftest import Corral

pytestmark = pytest.mark.timeout(120)


def _until(check: Callable[[], bool], within_s: float = 20.0) -> None:
    deadline = time.monotonic() + within_s
    while not check():
        assert time.monotonic() < deadline, "never happened"
        time.sleep(0.2)


def _state(sandbox_id: str) -> SandboxState | None:
    try:
        return Sandbox.get_info(sandbox_id).state
    except NotFoundException:
        return None


def _sleeping(sb: Sandbox) -> int:
    """Live ``sleep`` processes in the sandbox (not the zombies its init has still to reap)."""
    out = sb.commands.run("ps -eo stat=,comm=").stdout.splitlines()
    return sum(1 for line in out if line.split()[1:] == ["sleep"] and not line.startswith("Z"))


def test_timeouts_pause_or_kill_as_the_lifecycle_says(sdk_env: Corral) -> None:
    kept = Sandbox.create(timeout=60, lifecycle={"on_timeout": "pause"})
    files = Sandbox.create(timeout=60, lifecycle={"on_timeout": {"action": "pause", "mode": "filesystem"}})
    killed = Sandbox.create(timeout=60)
    woken = Sandbox.create(timeout=3, lifecycle={"on_timeout": "pause", "auto_resume": True})
    boxes = (kept, woken, files, killed)
    try:
        woken.files.write("/tmp/note", "woken")
        assert kept.get_info().lifecycle == {"on_timeout": "pause", "auto_resume": False}
        assert woken.get_info().lifecycle == {"on_timeout": "pause", "auto_resume": True}
        assert killed.get_info().lifecycle == {"on_timeout": "kill", "auto_resume": False}
        for sb in (kept, files):
            sb.files.write("/tmp/note", "written before")
            sb.commands.run("sleep 600", background=True)
        for sb in (kept, files, killed):
            sb.set_timeout(1)

        _until(lambda: [_state(b.sandbox_id) for b in boxes] == [SandboxState.PAUSED] * 3 + [None])
        assert not kept.is_running()

        # Without auto-resume a data-plane call finds it not running, and it stays paused.
        with pytest.raises(SandboxNotRunningException):
            kept.commands.run("true")
        assert _state(kept.sandbox_id) is SandboxState.PAUSED

        # With auto-resume the call wakes it, its timeout set again from now.
        assert woken.files.read("/tmp/note") == "woken"
        assert _state(woken.sandbox_id) is SandboxState.RUNNING
        left = woken.get_info().end_at - datetime.datetime.now(datetime.UTC)
        assert datetime.timedelta(0) < left <= datetime.timedelta(seconds=3)  # as it was created

        # An explicit connect resumes the others: with its memory, the command still runs; with the
        # files alone, a reboot: what was written is there, what ran does not.
        again = Sandbox.connect(kept.sandbox_id, timeout=60)
        assert again.files.read("/tmp/note") == "written before"
        assert [p.args[-1] for p in again.commands.list()] == ["sleep 600"]
        rebooted = Sandbox.connect(files.sandbox_id, timeout=60)
        assert rebooted.files.read("/tmp/note") == "written before"
        assert _sleeping(rebooted) == 0
        _until(lambda: rebooted.commands.list() == [], 5)

        # The auto-resumed one times out again and is paused again: its lifecycle holds.
        _until(lambda: _state(woken.sandbox_id) is SandboxState.PAUSED)
    finally:
        for sb in boxes:
            sb.kill()  # False for the one already gone


def test_an_explicit_pause_without_memory_and_a_resume_as_a_reboot(sandbox: Sandbox) -> None:
    sandbox.files.write("/tmp/note", "kept")
    sandbox.commands.run("sleep 600", background=True)
    _until(lambda: _sleeping(sandbox) == 1, 5)
    sandbox.pause(mode="filesystem")
    assert _state(sandbox.sandbox_id) is SandboxState.PAUSED
    back = Sandbox.connect(sandbox.sandbox_id)
    assert back.files.read("/tmp/note") == "kept" and _sleeping(back) == 0
    _until(lambda: back.commands.list() == [], 5)  # its end, as its host saw the kill

    back.commands.run("sleep 600", background=True)
    _until(lambda: _sleeping(back) == 1, 5)  # in the sandbox (a launch still joining it would run on)
    back.pause()  # with its memory: the resume below is asked to reboot it
    rebooted = Sandbox.connect(sandbox.sandbox_id, on_resume="reboot")
    assert rebooted.files.read("/tmp/note") == "kept" and _sleeping(rebooted) == 0
    _until(lambda: rebooted.commands.list() == [], 5)
