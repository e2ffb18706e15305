"""What only gVisor adds, against ``corral serve --runtime gvisor``: between the tenant's processes and
the host's kernel stands gVisor's, so the host's kernel, processes, /proc and /sys are out of sight.
The attacks both runtimes must stop (no privilege, no host port, no host account, no other sandbox)
run on gVisor too, from the rest of this suite (see conftest.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from .runtime_serve import Serve

pytestmark = [pytest.mark.process, pytest.mark.gvisor_subset]


@pytest.fixture(scope="module", params=["gvisor"])
def runtime_name(request: pytest.FixtureRequest) -> str:
    """This module's checks are gVisor's alone: only the seam's gVisor half."""
    return str(request.param)


# What the tenant can find of the host in /proc and /sys, asked of paths the host has. JSON on stdout.
_LOOK = r"""
import json, os, sys
def listing(path):
    try:
        return sorted(os.listdir(path))
    except OSError as exc:
        return exc.errno
paths = sys.argv[1:]
print(json.dumps({
    "pids": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()),
    "exists": {p: os.path.exists(p) for p in paths},
    "cgroups": listing("/sys/fs/cgroup"),
    "version": open("/proc/version").read(),
}))
"""


def test_the_kernel_a_tenant_meets_is_gvisor_s(serve: Serve) -> None:
    sid = serve.create()
    out = serve.exec_python(
        sid,
        "import json, os; print(json.dumps({'release': os.uname().release,"
        " 'pids': sorted(int(p) for p in os.listdir('/proc') if p.isdigit()),"
        " 'cmdline': open('/proc/1/cmdline').read()}))",
    )
    assert out["release"] != os.uname().release  # gVisor's kernel answers, not the host's
    assert out["cmdline"].split("\0")[0] == "/.corral/init"  # its own pid 1
    assert len(out["pids"]) < 10  # its own few processes; none of the host's
    assert os.getpid() not in out["pids"] or len(out["pids"]) < 10
    serve.delete(sid)


def test_the_guest_kernel_is_gvisor_s_and_says_so(serve: Serve) -> None:
    sid = serve.create()
    try:
        dmesg = serve.exec(sid, ["dmesg"])
        assert dmesg["exit_code"] == 0 and "Starting gVisor" in dmesg["stdout"], dmesg
        version = serve.exec(sid, ["cat", "/proc/version"])["stdout"]
        assert version.startswith("Linux version ") and version != Path("/proc/version").read_text()
        assert os.uname().version not in version
    finally:
        serve.delete(sid)


def test_the_host_s_proc_and_sys_are_not_visible(serve: Serve) -> None:
    sid = serve.create()
    try:
        host_pids = [os.getpid(), serve.proc.popen.pid, *serve.host_pids(sid)]
        cgroup = serve.cgroup_dirs(sid)[0]
        assert cgroup.is_dir()  # on the host: this sandbox's own memory cgroup
        host_only = [
            *(f"/proc/{pid}" for pid in host_pids if pid > 16),  # past the guest's own few pids
            str(cgroup),
            "/sys/kernel/mm",
            *(f"/sys/class/net/{name}" for name in os.listdir("/sys/class/net") if name != "lo"),
        ]
        assert all(Path(p).exists() for p in host_only)
        seen = serve.exec_python(sid, _LOOK, *host_only)
        assert seen["exists"] == {p: False for p in host_only}, seen
        assert not set(seen["pids"]) & set(host_pids), seen["pids"]
        # gVisor's /sys is its own: its cgroup directory holds none of the host's hierarchies.
        host_cgroups = os.listdir("/sys/fs/cgroup")
        assert host_cgroups and not set(host_cgroups) & set(seen["cgroups"] or []), seen["cgroups"]
        assert seen["version"] != Path("/proc/version").read_text()
    finally:
        serve.delete(sid)


def test_one_sandbox_sees_and_signals_nothing_of_another(serve: Serve) -> None:
    a, b = serve.create(), serve.create()
    marker = "sleep 3011"
    serve.exec(b, ["sh", "-c", f"{marker} >/dev/null 2>&1 &"])
    seen = serve.exec(a, ["sh", "-c", "cat /proc/[0-9]*/cmdline | tr '\\0' ' '"])["stdout"]
    assert "3011" not in seen
    killed = serve.exec(a, ["sh", "-c", "kill -9 -1; echo done"])
    assert "done" in killed["stdout"] or killed["exit_code"] != 0
    still = serve.exec(b, ["sh", "-c", "cat /proc/[0-9]*/cmdline | tr '\\0' ' '"])["stdout"]
    assert "3011" in still  # b's process outlived a's attempt
    serve.delete(a)
    serve.delete(b)


def test_nothing_of_the_tenant_is_on_a_host_command_line_and_nothing_of_the_host_in_its_descriptors(
    serve: Serve,
) -> None:
    sid = serve.create(env={"SECRETISH": "env-marker-5b1e"})
    marker = "argv-marker-77a1"
    serve.exec(sid, ["sh", "-c", f"python3 -c 'import time; time.sleep(30)' {marker} >/dev/null 2>&1 &"])
    assert marker in serve.exec(sid, ["sh", "-c", "cat /proc/[0-9]*/cmdline | tr '\\0' ' '"])["stdout"]
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        assert marker.encode() not in cmdline and b"env-marker-5b1e" not in cmdline
    fds = serve.exec(sid, ["sh", "-c", "for f in /proc/1/fd/*; do readlink $f; done"])["stdout"]
    assert str(serve.state) not in fds and "host-" not in fds
    serve.delete(sid)


def test_a_sandbox_s_files_stay_within_its_memory(serve: Serve) -> None:
    """Its writable places are sized to its memory: a tenant that writes without end gets ENOSPC (or is
    killed) and the host's disk is as it was."""
    before = os.statvfs("/").f_bavail * os.statvfs("/").f_frsize
    sid = serve.create(memory_mb=128)
    wrote = serve.exec(
        sid, ["sh", "-c", "dd if=/dev/zero of=/tmp/fill bs=1M count=1024; echo rc=$?"], timeout_s=60
    )
    assert "rc=0" not in wrote["stdout"] or wrote["exit_code"] != 0
    after = os.statvfs("/").f_bavail * os.statvfs("/").f_frsize
    assert before - after < 256 * 1024 * 1024
    serve.delete(sid)


def test_a_sandbox_that_is_deleted_leaves_nothing(serve: Serve) -> None:
    sid = serve.create()
    assert serve.exec(sid, ["true"])["exit_code"] == 0
    serve.delete(sid)
    assert not list(serve.state.glob(f"*/sandboxes/{sid}"))
    r = serve.tenant.get(f"/v1/sandboxes/{sid}")
    assert r.status_code in (404, 200) and (r.status_code == 404 or r.json()["state"] == "deleted")
    rt_state = [json.loads(p.read_text()) for p in serve.state.glob("*/runsc/*/*.json") if p.is_file()]
    assert not [s for s in rt_state if sid in json.dumps(s)]
