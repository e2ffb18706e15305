"""The privilege boundary of a process sandbox, at the runtime: its own host uid, no capabilities, no new
privileges, a seccomp filter, no nested user namespaces, a curated /etc, limits in its cgroups."""

from __future__ import annotations

import asyncio
import contextlib
import os
import stat
import subprocess
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from corral.runtime import launcher
from corral.runtime.base import SandboxSpec
from corral.runtime.cgroups import SandboxCgroup
from corral.runtime.process import InvalidSandbox, ProcessRuntime
from corral.runtime.statedir import Running
from corral.runtime.uids import DEFAULT_LEASE_DIR, DEFAULT_UIDS
from tests.runtime.conftest import RuntimeFactory

pytestmark = pytest.mark.process


def _status(text: str) -> dict[str, str]:
    return {k: v.strip() for k, _, v in (line.partition(":") for line in text.splitlines())}


def _record(runtime: ProcessRuntime, sandbox_id: str) -> Running:
    record = runtime.statedir.load(sandbox_id)
    assert isinstance(record, Running)
    return record


async def test_every_sandbox_process_is_unprivileged(process_runtime: ProcessRuntime) -> None:
    await process_runtime.start(SandboxSpec(id="locked", memory_mb=64))
    for pid in ("self", "1"):  # an exec'd process, and the init bubblewrap started
        status = _status((await process_runtime.exec("locked", ["cat", f"/proc/{pid}/status"])).stdout)
        assert status["NoNewPrivs"] == "1", pid
        assert status["CapBnd"] == status["CapEff"] == status["CapPrm"] == "0000000000000000", pid
        assert status["Seccomp"] == "2", pid
    # The workload, not the sandbox's skeleton, is what the OOM killer takes first.
    assert (await process_runtime.exec("locked", ["cat", "/proc/self/oom_score_adj"])).stdout == "500\n"


@pytest.mark.parametrize(
    "command",
    [
        ["unshare", "-U", "true"],
        ["unshare", "-Ur", "true"],
        ["unshare", "-m", "true"],
        ["python3", "-c", "import os; os.unshare(os.CLONE_NEWUSER)"],
        ["mount", "-t", "tmpfs", "none", "/tmp"],
    ],
)
async def test_no_nested_namespaces_or_mounts(process_runtime: ProcessRuntime, command: list[str]) -> None:
    await process_runtime.start(SandboxSpec(id="flat", memory_mb=64))
    result = await process_runtime.exec("flat", command)
    assert result.exit_code != 0, result.stdout


async def test_the_filter_denies_what_a_sandbox_has_no_business_with(process_runtime: ProcessRuntime) -> None:
    probe = """
import ctypes, errno, os
libc = ctypes.CDLL(None, use_errno=True)
def call(nr, *args):
    ctypes.set_errno(0)
    rc = libc.syscall(nr, *args)
    return "ok" if rc >= 0 else errno.errorcode[ctypes.get_errno()]
# x86_64 numbers: keyctl, bpf, perf_event_open, userfaultfd, io_uring_setup, clone3, personality
print(call(250, 0, 0), call(321, 0, 0, 0), call(298, 0, 0, 0, 0, 0), call(323, 0), call(425, 1, 0),
      call(435, 0, 0), call(135, 0x0040000), call(135, 0xffffffff))
"""
    await process_runtime.start(SandboxSpec(id="filtered", memory_mb=64))
    result = await process_runtime.exec("filtered", ["python3", "-c", probe])
    assert result.exit_code == 0, result.stderr
    assert result.stdout.split() == ["EPERM"] * 5 + ["ENOSYS", "EPERM", "ok"]


async def test_each_sandbox_is_its_own_host_uid(make_process_runtime: Callable[..., ProcessRuntime]) -> None:
    runtime = make_process_runtime()
    await runtime.start(SandboxSpec(id="one", memory_mb=64))
    await runtime.start(SandboxSpec(id="two", memory_mb=64))
    uids = []
    for sandbox_id in ("one", "two"):
        record = _record(runtime, sandbox_id)
        status = _status(Path(f"/proc/{record.init.pid}/status").read_text())
        host_uid = int(status["Uid"].split()[0])
        assert host_uid == record.uid and host_uid in DEFAULT_UIDS
        lease = (DEFAULT_LEASE_DIR / str(host_uid)).read_text()
        assert sandbox_id in lease and str(runtime.statedir.root.resolve()) in lease
        uids.append(host_uid)
    assert uids[0] != uids[1]
    # A runtime that re-adopts the sandbox keeps its uid; stopping it gives the uid back.
    again = make_process_runtime()
    assert {h.id for h in await again.list()} == {"one", "two"}
    assert _record(again, "one").uid == uids[0]
    await again.stop("one")
    assert not (DEFAULT_LEASE_DIR / str(uids[0])).exists()


async def test_etc_is_curated(process_runtime: ProcessRuntime) -> None:
    await process_runtime.start(SandboxSpec(id="etc", memory_mb=64, hostname="box-9"))
    listing = (await process_runtime.exec("etc", ["ls", "/etc"])).stdout.split()
    assert "shadow" not in listing and "passwd" in listing and "resolv.conf" in listing
    assert set(listing) < set(os.listdir("/etc"))  # a few of the host's files, never all of them
    passwd = (await process_runtime.exec("etc", ["cat", "/etc/passwd"])).stdout
    assert [line.split(":")[0] for line in passwd.splitlines()] == ["root", "user", "nobody"]
    assert (await process_runtime.exec("etc", ["getent", "hosts", "box-9"])).exit_code == 0
    assert (await process_runtime.exec("etc", ["whoami"])).stdout == "user\n"


async def test_limits_are_in_the_sandbox_cgroups(process_runtime: ProcessRuntime) -> None:
    await process_runtime.start(SandboxSpec(id="limited", memory_mb=96, cpus=0.5, pids=40))
    record = _record(process_runtime, "limited")
    assert record.cgroup is not None and record.cgroup_version is not None
    cgroup = SandboxCgroup(Path(record.cgroup), record.cgroup_version, tuple(map(Path, record.cgroup_extra)))
    assert cgroup.limit_mb() == 96
    assert cgroup.cpu_quota() == (50_000, 100_000)
    assert cgroup.pids_limit() == 40
    # Forking past the limit fails inside; the sandbox itself keeps working.
    storm = await process_runtime.exec(
        "limited", ["sh", "-c", "for i in $(seq 100); do sleep 30 & done; echo spawned"], timeout_s=20
    )
    assert storm.exit_code != 0 and "fork" in storm.stderr.lower()
    assert len(cgroup.pids()) <= 40
    assert await process_runtime.resident_mb("limited") is not None  # still measured, still there


async def test_oom_kills_are_counted(process_runtime: ProcessRuntime) -> None:
    await process_runtime.start(SandboxSpec(id="greedy", memory_mb=32))
    assert await process_runtime.oom_kills("greedy") == 0
    hog = await process_runtime.exec("greedy", ["python3", "-c", "b = bytearray(200 * 1024 * 1024)"])
    assert hog.exit_code == 137
    assert await process_runtime.oom_kills("greedy") >= 1


async def test_what_execve_would_refuse_is_invalid_not_a_failure(process_runtime: ProcessRuntime) -> None:
    await process_runtime.start(SandboxSpec(id="bounded", memory_mb=64))
    for kwargs in (
        {"command": ["echo", "x" * 200_000]},
        {"command": ["echo", *(["y" * 100_000] * 11)]},
        {"command": ["true"], "env": {"BIG": "v" * 200_000}},
        {"command": ["true"], "env": {"A=B": "c"}},
        {"command": ["true"], "env": {"A": "nul\0here"}},
        {"command": ["true"], "cwd": "/tmp\0/etc"},
    ):
        with pytest.raises(InvalidSandbox) as refused:
            await process_runtime.exec("bounded", **kwargs)  # type: ignore[arg-type]
        assert refused.value.field in ("command", "env", "cwd")
    largest = {f"K{i}": "v" * 100_000 for i in range(9)}
    launcher.check_command(["true"], largest, "/")
    assert (await process_runtime.exec("bounded", ["true"], env=largest)).exit_code == 0


@pytest.mark.parametrize("guest_channel", [True, False], ids=["channel", "launcher"])
async def test_the_host_side_launcher_carries_no_tenant_input(
    make_process_runtime: RuntimeFactory, guest_channel: bool
) -> None:
    process_runtime = make_process_runtime(guest_channel=guest_channel)
    secret = "tenant-secret-5d1e0c"
    await process_runtime.start(SandboxSpec(id="quiet", memory_mb=64, env={"SPEC_SECRET": secret}))
    running = asyncio.create_task(
        process_runtime.exec("quiet", ["sleep", "3"], env={"EXEC_SECRET": secret}, cwd="/tmp")
    )
    host_ns = os.readlink("/proc/self/ns/pid")
    init_pid = _record(process_runtime, "quiet").init.pid
    seen_launcher = seen_command = False
    for _ in range(100):
        await asyncio.sleep(0.02)
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
                if os.readlink(f"/proc/{pid}/ns/pid") != host_ns:
                    seen_command = seen_command or cmdline == b"sleep\x003\x00"
                    continue  # the sandbox's own processes may hold it
                environ = Path(f"/proc/{pid}/environ").read_bytes()
            except OSError:
                continue
            assert secret.encode() not in cmdline + environ, cmdline
            ours = b"\0exec\0%d\0" % init_pid  # neighbours' launchers may run meanwhile
            seen_launcher = seen_launcher or (b"launcher-" in cmdline and ours in cmdline)
    assert seen_command, "the scan ran while the command ran"
    # Through the guest channel no host-side process is started for a command at all.
    assert seen_launcher is not guest_channel, "the exec's launcher is on the host only without the channel"
    assert (await running).exit_code == 0


async def test_state_is_private(process_runtime: ProcessRuntime) -> None:
    await process_runtime.start(SandboxSpec(id="private", memory_mb=64, env={"TOKEN": "secret"}))
    root = process_runtime.statedir.root
    assert root.stat().st_mode & 0o777 == 0o700
    directory = process_runtime.statedir.dir("private")
    assert directory.stat().st_mode & 0o777 == 0o700
    files = list(directory.iterdir())
    # No log (bubblewrap's stderr is a pipe); the guest channel's socket, which only root can reach.
    assert {f.name for f in files} == {"sandbox.json", "channel"}
    assert stat.S_ISSOCK((directory / "channel").stat().st_mode)
    assert all(f.stat().st_mode & 0o777 == 0o600 for f in files)


async def test_the_sandbox_skeleton_holds_no_host_file(
    process_runtime: ProcessRuntime, eventually: Callable[..., Awaitable[bool]]
) -> None:
    await process_runtime.start(SandboxSpec(id="skeleton", memory_mb=64))
    record = _record(process_runtime, "skeleton")
    assert record.cgroup is not None
    members = [int(pid) for pid in (Path(record.cgroup) / "cgroup.procs").read_text().split()]
    assert sorted(members) == sorted([record.init.pid, record.monitor.pid])

    def held(pid: int) -> list[str]:
        targets = []
        for fd in sorted(os.listdir(f"/proc/{pid}/fd"), key=int):
            with contextlib.suppress(FileNotFoundError):  # the listing's own descriptor, closed since
                targets.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
        return targets

    async def init_let_go() -> bool:  # it says ready, then trades bubblewrap's pipes for /dev/null
        # Beyond them: its signalfd and the guest channel's sockets, never a file of the host's.
        own = held(record.init.pid)
        rest = own[3:]
        return own[:3] == ["/dev/null"] * 3 and all(t.startswith(("socket:", "anon_inode:")) for t in rest)

    assert await eventually(init_let_go), held(record.init.pid)
    # The monitor outside: pipes, /dev/null, its own event descriptors; never a file of the host's.
    monitor = held(record.monitor.pid)
    assert not [t for t in monitor if t.startswith("/") and t != "/dev/null"], monitor
    # Nor the guest channel's listening socket: the init alone holds it, so it dies with the init.
    assert not [t for t in monitor if t.startswith("socket:")], monitor
    # bubblewrap's stderr is a pipe nobody reads any more: the runtime closed its end once ready.
    stderr = os.readlink(f"/proc/{record.monitor.pid}/fd/2")
    assert stderr.startswith("pipe:") and stderr not in held(os.getpid())


async def test_the_launcher_refuses_a_recycled_init_pid(process_runtime: ProcessRuntime) -> None:
    await process_runtime.start(SandboxSpec(id="target", memory_mb=64))
    init = _record(process_runtime, "target").init
    spec = launcher.memfd("spec", launcher.encode(["id"], {}, "/"))
    try:
        # The same pid, but not the pid namespace the record names: as if the pid had been reused.
        argv = [str(launcher.path()), "exec", str(init.pid), str(init.pid_ns + 1), "1000", "1000", str(spec)]
        done = subprocess.run(
            argv, pass_fds=(spec,), capture_output=True, env=launcher.clean_env(), check=False
        )
    finally:
        os.close(spec)
    assert done.returncode == 125 and b"gone" in done.stderr and done.stdout == b""
