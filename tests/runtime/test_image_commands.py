"""An image sandbox's command server (corral.runtime.commands): its commands come through the guest
channel, not a host-side launcher each, with sudo working in them; the tenant's root gets nothing of
the server; a server that is gone is started again; its channel attacked from the host's side costs
only the attacking connection."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from corral.runtime import child, commands, guest, launcher, procfs
from corral.runtime.base import SandboxSpec
from corral.runtime.process import ProcessRuntime, _cgroup_of
from corral.runtime.stream import PtySize
from corral.testing.resolver import DictResolver
from tests.runtime.conftest import RuntimeFactory
from tests.runtime.images import Image, base_image, host_uids, image_runtime
from tests.runtime.test_guest_channel import _raw, _record, _rights, commands_behave

pytestmark = pytest.mark.process

# What a command reports of who started it: its parent's pid inside and that parent's name.
_PARENT = ["sh", "-c", "echo $PPID; cat /proc/$PPID/comm; id -u"]


@pytest.fixture(scope="session")
def image() -> Image:
    return base_image()


@pytest.fixture
def runtime(make_process_runtime: RuntimeFactory, tmp_path: Path, image: Image) -> ProcessRuntime:
    return image_runtime(make_process_runtime, tmp_path, DictResolver({image.digest: image.path}))


async def _started(
    runtime: ProcessRuntime, image: Image, sandbox_id: str, eventually: Callable[..., Awaitable[bool]]
) -> int:
    """The sandbox started and served by its command server (started with it, not waited for: the
    launcher runs what comes before), whose host pid this is."""
    await runtime.start(SandboxSpec(id=sandbox_id, memory_mb=256, image=image.digest, disk_mb=32))
    await _serving(runtime, sandbox_id, eventually)
    return _server(runtime, sandbox_id)


def _servers(runtime: ProcessRuntime, sandbox_id: str) -> list[int]:
    """The sandbox's command servers, by their host pids (not their children yet to exec, of the same
    name until then)."""
    cgroup = _cgroup_of(_record(runtime, sandbox_id))
    assert cgroup is not None
    named = [p for p in cgroup.pids() if _comm(p) == commands.SERVER_NAME]
    return [p for p in named if procfs.parent(p) not in named]


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _ended(pid: int) -> Callable[[], Awaitable[bool]]:
    """Whether ``pid`` has exited (gone, or a zombie its reaper, the host's, has not collected yet)."""

    async def probe() -> bool:
        try:
            return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
        except OSError:
            return True

    return probe


def _server(runtime: ProcessRuntime, sandbox_id: str) -> int:
    servers = _servers(runtime, sandbox_id)
    assert len(servers) == 1, servers
    return servers[0]


@pytest.fixture
def no_launcher(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every host-side process refused: a command the launcher would run fails the test."""

    async def refused(*args: Any, **kwargs: Any) -> child.Child:
        raise AssertionError(f"a host-side process was started: {args}")

    monkeypatch.setattr(child, "start", refused)


async def _by_server(runtime: ProcessRuntime, sandbox_id: str) -> bool:
    """Whether a command of the sandbox's ran as a child of its command server (pid > 1 inside), not
    of the launcher (whose host-side parent is outside: pid 0); it runs either way."""
    result = await runtime.exec(sandbox_id, _PARENT)
    assert result.exit_code == 0, result
    if result.stdout.split()[0] == "0":
        return False
    ppid, comm, uid = result.stdout.split()
    assert (comm, uid) == (commands.SERVER_NAME, "1000") and int(ppid) > 1, result
    return True


async def _served(runtime: ProcessRuntime, sandbox_id: str) -> None:
    assert await _by_server(runtime, sandbox_id)


async def _serving(
    runtime: ProcessRuntime, sandbox_id: str, eventually: Callable[..., Awaitable[bool]]
) -> None:
    assert await eventually(lambda: _by_server(runtime, sandbox_id))


async def test_commands_come_through_the_server_with_sudo(
    runtime: ProcessRuntime,
    image: Image,
    eventually: Callable[..., Awaitable[bool]],
    monkeypatch: pytest.MonkeyPatch,
    request: pytest.FixtureRequest,
) -> None:
    server = await _started(runtime, image, "img-chan", eventually)
    assert host_uids(server) == [0] * 4  # the host's, not the sandbox's root
    # Its parent, outside, is the launcher that started it, which reaps it (not the host's pid 1).
    reaper = procfs.parent(server)
    assert reaper is not None and Path(f"/proc/{reaper}/exe").resolve() == launcher.path()
    request.getfixturevalue("no_launcher")
    await _served(runtime, "img-chan")
    sudo = await runtime.exec("img-chan", ["sudo", "sh", "-c", "id -u; id -un; touch /etc/by-sudo"])
    assert (sudo.exit_code, sudo.stdout) == (0, "0\nroot\n"), sudo
    as_root = await runtime.spawn(
        "img-chan", ["sh", "-c", "id -u; echo $HOME; cat /proc/$PPID/comm"], user="root"
    )
    assert await as_root.stdout.read() == f"0\n/root\n{commands.SERVER_NAME}\n".encode()
    assert await as_root.wait() == 0
    # The capabilities exec-root gives: a container root's bounding set, no no_new_privs.
    status = await runtime.exec(
        "img-chan", ["grep", "-E", "^(CapBnd|NoNewPrivs|Seccomp):", "/proc/self/status"]
    )
    fields = dict(line.split(":\t") for line in status.stdout.splitlines())
    assert fields == {"CapBnd": "00000000a00005fb", "NoNewPrivs": "0", "Seccomp": "2"}, fields
    # Exit codes, errors, the environment and working directory, as the launcher gives them.
    result = await runtime.exec(
        "img-chan",
        ["sh", "-c", 'echo "$FROM_EXEC $(pwd)"; echo e >&2; exit 7'],
        env={"FROM_EXEC": "x"},
        cwd="/tmp",
    )
    assert (result.exit_code, result.stdout, result.stderr) == (7, "x /tmp\n", "e\n")
    await commands_behave(runtime, "img-chan", eventually)
    # A timeout's kill.
    slow = await runtime.exec("img-chan", ["sh", "-c", "sleep 61 & sleep 61"], timeout_s=0.5)
    assert slow.timed_out and slow.exit_code == 137

    async def no_sleep() -> bool:
        left = await runtime.exec("img-chan", ["sh", "-c", "cat /proc/[0-9]*/comm"])
        return "sleep" not in left.stdout.split()

    assert await eventually(no_sleep)
    assert _servers(runtime, "img-chan") == [server]  # the one server served it all
    monkeypatch.undo()
    await runtime.stop("img-chan")
    assert await eventually(_ended(server))  # it ended with the sandbox


async def test_the_tenants_root_gets_nothing_of_the_server(
    runtime: ProcessRuntime, image: Image, eventually: Callable[..., Awaitable[bool]]
) -> None:
    server = await _started(runtime, image, "img-attack", eventually)
    find = "pid=$(grep -lx corral-commands /proc/[0-9]*/comm | cut -d/ -f3)"
    # PTRACE_ATTACH (16) by ptrace's number on x86_64 (101).
    ptrace = 'perl -e \'print syscall(101, 16, $ARGV[0] + 0, 0, 0) == -1 ? "$!\\n" : "attached\\n"\''
    script = (
        f"{find}; echo $pid; "
        "ls /proc/$pid/fd 2>&1 | head -1; "
        "cat /proc/$pid/environ 2>&1 | head -1; "
        "ls -l /proc/$pid/cwd 2>&1 | head -1; "
        "tr '\\0' ' ' < /proc/$pid/cmdline; echo; "
        f"{ptrace} $pid 2>&1; "
        "kill -STOP $pid 2>&1; kill -KILL $pid 2>&1; echo done"
    )
    result = await runtime.exec("img-attack", ["sudo", "sh", "-c", script])
    lines = result.stdout.splitlines()
    assert int(lines[0]) > 1, result  # it sees the server...
    assert all("Permission denied" in line for line in lines[1:4]), result  # ...and none of its files
    assert str(runtime.statedir.root) not in lines[4] and "/sys/fs/cgroup" not in lines[4], lines[4]
    assert lines[5] == "Operation not permitted", result  # no ptrace
    assert result.stdout.count("kill: Operation not permitted") == 2, result  # no signal, not even a stop
    assert _servers(runtime, "img-attack") == [server]
    assert Path(f"/proc/{server}/stat").read_text().split()[2] != "T"  # alive, not stopped
    await _served(runtime, "img-attack")


async def test_a_server_gone_is_started_again(
    runtime: ProcessRuntime,
    image: Image,
    make_process_runtime: RuntimeFactory,
    tmp_path: Path,
    eventually: Callable[..., Awaitable[bool]],
) -> None:
    first = await _started(runtime, image, "img-again", eventually)
    running = asyncio.create_task(runtime.exec("img-again", ["sleep", "60"], timeout_s=30))
    await asyncio.sleep(0.3)
    os.kill(first, signal.SIGKILL)
    # Its command is reported lost (never a hang); the next one runs (through the launcher while none
    # serves) and starts a new server, which serves the commands after it.
    assert (await asyncio.wait_for(running, 10)).exit_code == 137
    assert (await runtime.exec("img-again", ["sudo", "true"])).exit_code == 0
    await _serving(runtime, "img-again", eventually)
    second = _server(runtime, "img-again")
    assert second != first
    # A reboot ends it with every other process; the same again after it.
    await runtime.reboot("img-again")
    assert _servers(runtime, "img-again") == []
    assert (await runtime.exec("img-again", ["sudo", "true"])).exit_code == 0
    await _serving(runtime, "img-again", eventually)
    # A restarted agent connects to the server that is there rather than starting one.
    adopted = image_runtime(make_process_runtime, tmp_path, DictResolver({image.digest: image.path}))
    assert [h.id for h in await adopted.list()] == ["img-again"]
    third = _server(adopted, "img-again")
    await _served(adopted, "img-again")
    assert _servers(adopted, "img-again") == [third]
    await adopted.stop("img-again")
    assert await eventually(_ended(third))


async def test_garbage_and_floods_on_the_servers_channel_cost_only_their_connection(
    runtime: ProcessRuntime, image: Image, eventually: Callable[..., Awaitable[bool]]
) -> None:
    server = await _started(runtime, image, "img-garbage", eventually)
    baseline = len(os.listdir(f"/proc/{server}/fd"))
    devnull = os.open(os.devnull, os.O_RDWR)
    spec = launcher.memfd("spec", launcher.encode(["true"], {}, "/"))
    try:
        # Users outside the sandbox's range, (uid_t)-1 among them, are refused before any fork.
        with _raw(runtime, "img-garbage") as sock:
            sock.settimeout(5)
            for number, user in enumerate((-1, 65536, 2**31 - 1), start=1):
                sock.sendmsg(
                    [guest.MESSAGE.pack(guest.MAGIC, guest.EXEC, number, user)],
                    _rights([spec, devnull, devnull, devnull]),
                )
                answer = guest.MESSAGE.unpack(sock.recv(64))
                assert answer[1:] == (guest.FAILED, number, 22), answer  # EINVAL
        header = guest.MESSAGE.pack(guest.MAGIC, guest.EXEC, 1, 0)
        for message, fds in [
            (b"x", []),
            (header[:15], [spec, devnull, devnull, devnull]),
            (b"\xff" * 16, [spec, devnull, devnull, devnull]),
            (header, [spec] + [devnull] * 20),
            (os.urandom(200_000), []),
        ]:
            with _raw(runtime, "img-garbage") as sock:
                try:
                    sock.sendmsg([message], _rights(fds))
                except OSError:
                    continue
                sock.settimeout(5)
                assert sock.recv(64) == b"", message[:20]
        # A flood that never reads its answers: the server hangs up on it.
        with _raw(runtime, "img-garbage") as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1)
            sock.settimeout(5)
            with pytest.raises(OSError):
                for sent in range(1, 5001):
                    sock.sendmsg(
                        [guest.MESSAGE.pack(guest.MAGIC, guest.EXEC, sent, 1000)],
                        _rights([spec, devnull, devnull, devnull]),
                    )
    finally:
        os.close(spec)
        os.close(devnull)
    assert _servers(runtime, "img-garbage") == [server]
    await _served(runtime, "img-garbage")
    assert len(os.listdir(f"/proc/{server}/fd")) <= baseline


async def test_first_commands_at_once_start_one_server(
    runtime: ProcessRuntime, image: Image, eventually: Callable[..., Awaitable[bool]]
) -> None:
    await runtime.start(SandboxSpec(id="img-burst", memory_mb=256, image=image.digest, disk_mb=32))
    ran = await asyncio.gather(*(runtime.exec("img-burst", ["sudo", "id", "-u"]) for _ in range(8)))
    assert [(r.exit_code, r.stdout) for r in ran] == [(0, "0\n")] * 8
    await _serving(runtime, "img-burst", eventually)
    server = _server(runtime, "img-burst")
    # One connection of this runtime's to it: its listener, signalfd, /dev/null and that connection.
    sockets = [os.readlink(f"/proc/{server}/fd/{fd}") for fd in os.listdir(f"/proc/{server}/fd")]
    assert len([s for s in sockets if s.startswith("socket:")]) == 2, sockets
    assert [p.name for p in runtime.statedir.dir("img-burst").iterdir() if p.is_socket()] == ["channel"]


async def test_the_server_ends_with_the_init_and_terminals_keep_the_launcher(
    runtime: ProcessRuntime, image: Image, eventually: Callable[..., Awaitable[bool]]
) -> None:
    server = await _started(runtime, image, "img-end", eventually)
    # A terminal's command still comes through the launcher, whose host-side parent is outside.
    shell = await runtime.spawn("img-end", ["sh", "-c", "echo ppid=$PPID; sudo id -u"], pty=PtySize(5, 40))
    assert await shell.wait() == 0
    assert (await shell.stdout.read()).split() == [b"ppid=0", b"0"]
    os.kill(_record(runtime, "img-end").init.pid, signal.SIGKILL)
    assert await eventually(_ended(server))
