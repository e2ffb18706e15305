"""The gvisor runtime's sandboxes end whole: one whose Sentry dies is found no more (so that its agent
reports it stopped) and its stop leaves nothing; a stop ends a command nobody reads; the sandbox
user's home is its own to write. Commands go through the Sentry's control socket: no host process
per command, the tenant's words only as the command's own, exit codes and signals as a shell's."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from corral.runtime.base import SandboxNotFound, SandboxSpec
from corral.runtime.cgroups import CgroupRoot
from corral.runtime.gvisor import GvisorRuntime, unavailable_reason

pytestmark = [
    pytest.mark.process,
    pytest.mark.skipif(unavailable_reason() is not None, reason=f"gvisor: {unavailable_reason()}"),
]


@pytest.fixture
async def gvisor(tmp_path: Path, cgroup_root: CgroupRoot) -> AsyncIterator[GvisorRuntime]:
    runtime = GvisorRuntime(tmp_path / "gvisor", cgroup_root=cgroup_root, cgroup_prefix="lc-")
    yield runtime
    for sandbox in (tmp_path / "gvisor" / "sandboxes").glob("*"):
        await runtime.stop(sandbox.name)
    assert not list((tmp_path / "gvisor" / "sandboxes").glob("*"))


async def test_a_sandbox_whose_sentry_dies_is_found_no_more_and_its_stop_leaves_nothing(
    gvisor: GvisorRuntime,
) -> None:
    await gvisor.start(SandboxSpec(id="dies", memory_mb=128))
    assert await gvisor.resident_mb("dies") is not None
    pids = gvisor.host_pids("dies")
    sentry = [p for p in pids if Path(f"/proc/{p}/cmdline").read_bytes().startswith(b"runsc-sandbox")]
    assert len(sentry) == 1, pids
    os.kill(sentry[0], signal.SIGKILL)  # the OOM killer's choice, or an operator's
    for _ in range(100):
        if not gvisor.host_pids("dies"):
            break
        await asyncio.sleep(0.05)
    with pytest.raises(SandboxNotFound):
        await gvisor.resident_mb("dies")  # what an agent's measuring sees: it reports it stopped
    with pytest.raises(SandboxNotFound):
        await gvisor.exec("dies", ["true"])
    cgroup = gvisor._cgroup("dies")
    assert cgroup is not None
    # A listing (an agent's adoption, or a restarted runtime's) finds it no more and takes its remains.
    assert [
        h.id for h in await GvisorRuntime(gvisor.root, cgroup_root=gvisor.cgroups, cgroup_prefix="lc-").list()
    ] == []
    with pytest.raises(SandboxNotFound):
        await gvisor.stop("dies")  # nothing of it is left to stop
    assert not cgroup.exists() and not any(p.exists() for p in cgroup.extra)
    assert not (gvisor.root / "sandboxes" / "dies").exists()
    assert not [p for p in (gvisor.root / "runsc").iterdir() if "dies" in p.name]


async def test_a_stop_ends_a_command_nobody_reads(gvisor: GvisorRuntime) -> None:
    await gvisor.start(SandboxSpec(id="unread", memory_mb=128))
    spawned = await gvisor.spawn("unread", ["cat", "/dev/zero"])
    await asyncio.sleep(0.5)  # its pipe fills; nothing reads it
    await gvisor.stop("unread")
    assert await asyncio.wait_for(spawned.wait(), 10) == 128 + signal.SIGKILL

    async def drained(stream: asyncio.StreamReader) -> None:
        while await stream.read(1 << 20):
            pass

    # And its output ends: no one else (the Sentry least of all) holds the pipes open.
    await asyncio.wait_for(asyncio.gather(drained(spawned.stdout), drained(spawned.stderr)), 10)


async def test_the_home_is_the_sandbox_user_s_own(gvisor: GvisorRuntime) -> None:
    await gvisor.start(SandboxSpec(id="home", memory_mb=128))
    wrote = await gvisor.exec("home", ["sh", "-c", "echo mine > ~/note && cat ~/note && id -u"])
    assert (wrote.exit_code, wrote.stdout) == (0, "mine\n1000\n"), wrote
    await gvisor.stop("home")


def _runsc_execs() -> list[int]:
    """The host's ``runsc exec`` processes (what a command cost before the control socket)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if any(a.endswith(b"runsc") for a in argv[:1]) and b"exec" in argv:
                found.append(int(entry.name))
    return found


async def test_a_command_runs_through_the_sentry_with_no_host_process_of_its_own(
    gvisor: GvisorRuntime,
) -> None:
    await gvisor.start(SandboxSpec(id="direct", memory_mb=128))
    running = await gvisor.spawn("direct", ["sh", "-c", "echo started; exec sleep 30"])
    assert await running.stdout.readline() == b"started\n"
    assert _runsc_execs() == []
    running.signal(signal.SIGTERM)
    assert await asyncio.wait_for(running.wait(), 10) == 128 + signal.SIGTERM
    # Exit codes as a shell's, a program that is not there as a shell says it.
    assert (await gvisor.exec("direct", ["sh", "-c", "exit 5"])).exit_code == 5
    assert (await gvisor.exec("direct", ["sh", "-c", "kill -9 $$"])).exit_code == 128 + signal.SIGKILL
    missing = await gvisor.exec("direct", ["no-such-program"])
    assert missing.exit_code == 127 and "no-such-program" in missing.stderr, missing
    # Input reaches the command; a timeout kills it.
    echo = await gvisor.spawn("direct", ["cat"], stdin=True)
    assert echo.stdin is not None
    echo.stdin.write(b"typed\n")
    await echo.stdin.drain()
    echo.stdin.close()
    assert await echo.stdout.read() == b"typed\n" and await echo.wait() == 0
    slow = await gvisor.exec("direct", ["sleep", "30"], timeout_s=0.5)
    assert slow.timed_out and slow.exit_code == 128 + signal.SIGKILL


async def test_a_tenant_s_words_stay_the_command_s_own(gvisor: GvisorRuntime) -> None:
    """What travels to the Sentry as JSON: an argument, a variable or a directory that looks like the
    call's own fields is only the command's text, and the command runs as the sandbox's user."""
    await gvisor.start(SandboxSpec(id="words", memory_mb=128))
    forged = '","KUID":0,"KGID":0,"argv":["id"],"x":"'
    result = await gvisor.exec(
        "words",
        ["sh", "-c", 'printf "%s|%s|" "$1" "$FORGED"; id -u; pwd', "sh", forged],
        env={"FORGED": forged + "\n\u00e9"},
        cwd="/tmp",
    )
    assert result.exit_code == 0, result
    assert result.stdout == f"{forged}|{forged}\n\u00e9|1000\n/tmp\n"
    bad_dir = await gvisor.exec("words", ["true"], cwd='/tmp/"}')
    assert bad_dir.exit_code == 127 and bad_dir.stdout == "", bad_dir


async def test_the_control_socket_is_out_of_the_guest_s_reach(gvisor: GvisorRuntime) -> None:
    """The Sentry listens in the host's network namespace; the guest's sockets are gVisor's own."""
    await gvisor.start(SandboxSpec(id="reach", memory_mb=128))
    probe = (
        "import socket, sys\n"
        "s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
        "try:\n"
        "    s.connect(sys.argv[1].encode().replace(b'@', b'\\0'))\n"
        "except OSError as e:\n"
        "    print('refused', e.errno)\n"
        "else:\n"
        "    print('connected')\n"
    )
    address = "@runsc-sandbox." + gvisor._cid("reach") + "@"
    result = await gvisor.exec("reach", ["python3", "-c", probe, address])
    assert result.stdout.startswith("refused"), result


async def test_ls_and_stat_work_through_the_statx_shim(gvisor: GvisorRuntime) -> None:
    """This runsc refuses the AT_NO_AUTOMOUNT coreutils passes to statx; the preloaded shim drops it,
    so listing and stat work, and a missing path still says so. The tenant cannot unload it."""
    await gvisor.start(SandboxSpec(id="ls", memory_mb=128))
    listed = await gvisor.exec("ls", ["sh", "-c", "touch /tmp/made && ls -la /tmp && stat -c %s /etc/passwd"])
    assert listed.exit_code == 0 and " made\n" in listed.stdout, listed
    assert listed.stderr == "", listed  # the shim loads without a word
    missing = await gvisor.exec("ls", ["ls", "/no/such/path"])
    assert missing.exit_code == 2 and "No such file or directory" in missing.stderr, missing
    tamper = await gvisor.exec("ls", ["sh", "-c", "echo > /etc/ld.so.preload; echo > /.corral/statx.so"])
    assert tamper.stderr.count("cannot create") == 2, tamper  # root's, and bound read-only


async def test_a_command_for_a_sandbox_whose_sentry_just_died_is_refused_as_stopped(
    gvisor: GvisorRuntime,
) -> None:
    """Asked before its remains are gone (the cgroup still holds the gofer and stubs), a command finds
    the control socket closed: the sandbox has ended (SandboxNotFound, an API's 404), not the runtime
    failed (a 502)."""
    await gvisor.start(SandboxSpec(id="just", memory_mb=128))
    pids = gvisor.host_pids("just")
    (sentry,) = [p for p in pids if Path(f"/proc/{p}/cmdline").read_bytes().startswith(b"runsc-sandbox")]
    gofers = [p for p in pids if Path(f"/proc/{p}/cmdline").read_bytes().startswith(b"runsc-gofer")]
    assert gofers, pids
    for gofer in gofers:
        os.kill(gofer, signal.SIGSTOP)  # held: the cgroup keeps a process while the socket is gone
    os.kill(sentry, signal.SIGKILL)
    for _ in range(100):
        if (
            not Path(f"/proc/{sentry}").exists()
            or b"Z" in Path(f"/proc/{sentry}/stat").read_bytes().split()[2]
        ):
            break
        await asyncio.sleep(0.02)
    with pytest.raises(SandboxNotFound):
        await gvisor.exec("just", ["true"])
    await gvisor.stop("just")
