"""A sandbox whose pid 1 dies, killed from the host or by its tenant from inside, is reported stopped
and leaves nothing on the host: no process, cgroup, state directory, uid lease or mount of its own.
On the process runtime the tenant cannot kill its pid 1 (the kernel drops a signal from inside the
pid namespace that pid 1 does not handle); inside gVisor it can, and the whole sandbox ends with it."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from corral.runtime.uids import DEFAULT_LEASE_DIR

from .runtime_serve import Serve

pytestmark = [pytest.mark.process, pytest.mark.gvisor_subset]

_KILL_PID_1 = "for s in KILL SEGV TERM INT HUP; do kill -$s 1; done; sleep 1; echo survived"


def _uid_leases(sandbox_id: str) -> list[Path]:
    if not DEFAULT_LEASE_DIR.is_dir():
        return []
    return [p for p in DEFAULT_LEASE_DIR.iterdir() if p.is_file() and sandbox_id in p.read_text()]


def _mounts(words: list[str]) -> list[str]:
    text = Path("/proc/self/mountinfo").read_text()
    return [line for line in text.splitlines() if any(word in line for word in words)]


class Footprint:
    """What the runtime holds for a sandbox on the host, taken while it runs."""

    def __init__(self, serve: Serve, sandbox_id: str) -> None:
        self.id = sandbox_id
        self.pids = serve.host_pids(sandbox_id)
        self.cgroups = serve.cgroup_dirs(sandbox_id)
        self.home = serve.home(sandbox_id)
        assert self.pids and all(p.is_dir() for p in self.cgroups) and self.home.is_dir()
        if serve.runtime == "process":
            assert _uid_leases(sandbox_id), "a process sandbox runs as a host uid leased to it"

    def left(self) -> dict[str, object]:
        alive = [pid for pid in self.pids if Path(f"/proc/{pid}").exists()]
        return {
            "processes": alive,
            "cgroups": [p for p in self.cgroups if p.exists()],
            "home": self.home.exists(),
            "uid leases": _uid_leases(self.id),
            "mounts": _mounts([str(self.home)]),  # an image's layers are mounted there
        }


def _nothing_left(footprint: Footprint) -> None:
    deadline = time.monotonic() + 30
    while (left := footprint.left()) != {
        "processes": [],
        "cgroups": [],
        "home": False,
        "uid leases": [],
        "mounts": [],
    }:
        assert time.monotonic() < deadline, left
        time.sleep(0.2)


def test_a_sandbox_whose_init_is_killed_from_the_host_is_stopped_and_leaves_nothing(serve: Serve) -> None:
    sid = serve.create()
    serve.exec(sid, ["sh", "-c", "sleep 300 >/dev/null 2>&1 &"])  # a process of the tenant's own too
    footprint = Footprint(serve, sid)
    os.kill(serve.init_pid(sid), signal.SIGKILL)  # its init, or on gVisor the Sentry that runs it
    serve.wait_stopped(sid)
    _nothing_left(footprint)
    assert serve.tenant.post(f"/v1/sandboxes/{sid}/exec", json={"command": ["true"]}).status_code != 200


def test_a_tenant_that_signals_its_pid_1_either_cannot_or_ends_its_sandbox_cleanly(serve: Serve) -> None:
    sid = serve.create()
    footprint = Footprint(serve, sid)
    result = serve.exec(sid, ["sh", "-c", _KILL_PID_1])
    if serve.gvisor:
        # gVisor delivers it: pid 1 dies and every process of the sandbox with it, this shell too.
        assert result["exit_code"] == 137 and "survived" not in result["stdout"], result
        serve.wait_stopped(sid)
        _nothing_left(footprint)
        return
    try:
        assert result["exit_code"] == 0 and result["stdout"] == "survived\n", result
        assert serve.exec(sid, ["echo", "alive"])["stdout"] == "alive\n"
        assert serve.tenant.get(f"/v1/sandboxes/{sid}").json()["state"] == "running"
    finally:
        serve.delete(sid)
    _nothing_left(footprint)
