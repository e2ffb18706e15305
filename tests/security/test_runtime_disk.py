"""A tenant cannot write the host's disk. No process of its sandbox holds a host file; the sandbox's
pid 1 (corral's init) is not dumpable, so it gives up nothing to ptrace, pidfd_getfd or /proc, and the
seccomp filter denies pidfd_getfd and process_vm_readv/writev outright; every place the tenant can
write is a tmpfs charged to its memory. Each attack runs for real inside, and the host's free space,
measured around it, does not move."""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import pytest

from .runtime_serve import Serve, runtime_root

pytestmark = pytest.mark.process

# Each attack below tries to take 1 GiB of disk; the machine is shared with other suites writing their
# own files meanwhile, so a drop is only counted as the sandbox's past this bound (1/16 of the attack).
DISK_BOUND_BYTES = 64 << 20
ATTACK_BYTES = 1 << 30

# Descriptor theft, ptrace and cross-process reads against every pid the tenant can name, pid 1 first;
# then writing through whatever descriptor of another process it can open. JSON on stdout.
_STEAL = r"""
import ctypes, errno, json, os, stat, sys, time
ATTACK = int(sys.argv[1])
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
libc.ptrace.restype = ctypes.c_long
libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
PIDFD_OPEN, PIDFD_GETFD = 434, 438  # the same number on every architecture
VM_READV = {"x86_64": 310, "aarch64": 270}[os.uname().machine]
PTRACE_ATTACH, PTRACE_DETACH = 16, 17

def err(rc):
    return 0 if rc >= 0 else ctypes.get_errno()

def grow(fd):
    # What the attack does with a writable descriptor: take a gigabyte of whatever it refers to.
    try:
        os.posix_fallocate(fd, 0, ATTACK)
        return "grown"
    except OSError as exc:
        return exc.errno

child = os.fork()  # a process of the tenant's own: the control for what stays allowed
if child == 0:
    time.sleep(60)
    os._exit(0)
me = os.getpid()
report = {"child": child, "pidfd_open": {}, "getfd": {}, "stolen": {}, "ptrace": {}, "vm_readv": {},
          "links": {}, "fd_dirs": {}, "opened": {}}
for pid in sorted(int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) != me):
    pidfd = libc.syscall(PIDFD_OPEN, pid, 0)
    report["pidfd_open"][pid] = err(pidfd)
    if pidfd < 0 and ctypes.get_errno() == errno.ESRCH:
        continue  # gone meanwhile
    results = []
    for target in range(10 if pidfd >= 0 else 0):
        got = libc.syscall(PIDFD_GETFD, pidfd, target, 0)
        results.append(err(got))
        if got >= 0:
            report["stolen"][f"{pid}/{target}"] = [os.readlink(f"/proc/self/fd/{got}"), grow(got)]
            os.close(got)
    if pidfd >= 0:
        report["getfd"][pid] = results
        os.close(pidfd)
    attached = libc.ptrace(PTRACE_ATTACH, pid, None, None)
    report["ptrace"][pid] = err(attached)
    if attached == 0:
        os.waitpid(pid, 0)
        libc.ptrace(PTRACE_DETACH, pid, None, None)
    report["vm_readv"][pid] = err(libc.syscall(VM_READV, pid, None, 0, None, 0, 0))
    try:
        fds = sorted(int(fd) for fd in os.listdir(f"/proc/{pid}/fd"))
        report["fd_dirs"][pid] = "listed"
    except OSError as exc:
        fds = list(range(10))  # guessed, as an attacker would
        report["fd_dirs"][pid] = exc.errno
    for name in ["cwd", "root", "exe", *(f"fd/{fd}" for fd in fds)]:
        try:
            report["links"][f"{pid}/{name}"] = os.readlink(f"/proc/{pid}/{name}")
        except OSError as exc:
            report["links"][f"{pid}/{name}"] = exc.errno
    if pid == child:
        continue  # its descriptors are this program's own stdout and stderr
    for fd in fds:
        try:
            opened = os.open(f"/proc/{pid}/fd/{fd}", os.O_WRONLY | os.O_APPEND | os.O_NONBLOCK)
        except OSError as exc:
            report["opened"][f"{pid}/{fd}"] = exc.errno
            continue
        regular = stat.S_ISREG(os.fstat(opened).st_mode)
        report["opened"][f"{pid}/{fd}"] = ["regular" if regular else "other", grow(opened) if regular else None]
        os.close(opened)
os.kill(child, 9)
os.waitpid(child, 0)
print(json.dumps(report))
"""

# The directories the tenant can create files in, from its own mount table, with their file system.
_WRITABLE = r"""
import json, os, tempfile
writable = {}
for line in open("/proc/self/mountinfo"):
    fields = line.split()
    point, fstype = fields[4], fields[fields.index("-") + 1]
    if not os.path.isdir(point):
        continue
    try:
        fd, name = tempfile.mkstemp(dir=point)
    except OSError:
        continue
    os.close(fd)
    os.unlink(name)
    writable[point] = fstype
print(json.dumps(writable))
"""

_FALLOCATE = r"""
import json, os, sys
path = os.path.join(sys.argv[1], "corral-fill")
fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
print("opened", flush=True)  # past here, an OOM kill is the memory limit refusing the file
try:
    os.posix_fallocate(fd, 0, int(sys.argv[2]))
    print("grown")
except OSError as exc:
    print(exc.errno)
"""


def _free_bytes(*paths: Path) -> dict[str, int]:
    return {str(p): os.statvfs(p).f_bavail * os.statvfs(p).f_frsize for p in paths}


def _assert_disk_held(before: dict[str, int], after: dict[str, int]) -> None:
    for path, free in before.items():
        assert free - after[path] < DISK_BOUND_BYTES, f"{path}: {free - after[path]} bytes of disk gone"


@pytest.mark.gvisor_subset
def test_no_descriptor_of_another_process_reaches_the_host(serve: Serve) -> None:
    sid = serve.create()
    try:
        # A process of the tenant's own, orphaned to the init, for the attack to find beside pid 1.
        serve.exec(sid, ["sh", "-c", "sleep 60 >/dev/null 2>&1 </dev/null &"])
        root = runtime_root(serve, sid)
        before = _free_bytes(root, Path("/"))
        report = serve.exec_python(sid, _STEAL, str(ATTACK_BYTES))

        assert "1" in report["pidfd_open"] and len(report["pidfd_open"]) >= 3  # pid 1, the orphan, the child
        assert report["stolen"] == {}
        if serve.gvisor:
            # gVisor's kernel has no pidfd_open to take a descriptor through; whatever else the
            # tenant reaches is the guest's (its processes are gVisor's tasks, its files the
            # Sentry's), and the checks below hold of it.
            assert set(report["pidfd_open"].values()) == {errno.ENOSYS}, report["pidfd_open"]
            _no_host_file_reached(serve, report, root, before)
            return
        # No descriptor of any process, its own child's included: the filter denies pidfd_getfd.
        assert {e for results in report["getfd"].values() for e in results} == {errno.EPERM}
        # ptrace of pid 1 is refused (not dumpable); of its own processes it still works (gdb, strace).
        child = str(report["child"])
        assert report["ptrace"]["1"] == errno.EPERM
        assert report["ptrace"][child] == 0
        # process_vm_readv is denied whatever the target.
        assert set(report["vm_readv"].values()) == {errno.EPERM}
        # pid 1's descriptors, cwd, root and executable are closed to the tenant, guessed or listed.
        assert report["fd_dirs"]["1"] == errno.EACCES
        pid1 = {k: v for k, v in report["links"].items() if k.startswith("1/")}
        assert pid1 and set(pid1.values()) == {errno.EACCES}, pid1
        opened_pid1 = {k: v for k, v in report["opened"].items() if k.startswith("1/")}
        assert opened_pid1 and set(opened_pid1.values()) == {errno.EACCES}, opened_pid1
        _no_host_file_reached(serve, report, root, before)
    finally:
        serve.delete(sid)


def _no_host_file_reached(serve: Serve, report: dict[str, Any], root: Path, before: dict[str, int]) -> None:
    # Whatever it could open is no file at all (pipes, /dev/null), and no link it can read names
    # anything of the host's state.
    assert all(v[0] == "other" for v in report["opened"].values() if isinstance(v, list)), report
    targets = [v for v in report["links"].values() if isinstance(v, str)]
    assert targets and not [t for t in targets if str(serve.state) in t or root.name in t], targets
    _assert_disk_held(before, _free_bytes(root, Path("/")))


def test_every_place_a_tenant_writes_is_its_memory_not_the_hosts_disk(serve: Serve) -> None:
    sid = serve.create(memory_mb=128)
    try:
        writable = serve.exec_python(sid, _WRITABLE)
        assert {"/tmp", "/home/user", "/dev/shm"} <= set(writable), writable
        assert set(writable.values()) == {"tmpfs"}, writable
        root = runtime_root(serve, sid)
        before = _free_bytes(root, Path("/"))
        for directory in writable:
            filled = serve.exec(sid, ["python3", "-c", _FALLOCATE, directory, str(ATTACK_BYTES)])
            lines = filled["stdout"].split()
            assert lines[:1] == ["opened"], filled
            # Refused for its size (home, /tmp, /dev/shm are sized at the memory limit) or stopped by
            # the memory limit (an OOM kill): never a gigabyte granted.
            assert lines[1:] == [str(errno.ENOSPC)] or filled["exit_code"] == 137, (directory, filled)
            serve.exec(sid, ["rm", "-f", f"{directory.rstrip('/')}/corral-fill"])
        after = _free_bytes(root, Path("/"))
        _assert_disk_held(before, after)
        assert serve.exec(sid, ["echo", "still here"])["stdout"] == "still here\n"
    finally:
        serve.delete(sid)
