"""The guest channel (corral.runtime.guest): commands run by the sandbox's init, the channel attacked
from the host's side (garbage, oversize messages, wrong descriptors, floods: the init must survive all
of it and keep serving), and never reachable from inside the sandbox."""

from __future__ import annotations

import array
import asyncio
import os
import random
import signal
import socket
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from corral.runtime import guest, launcher, procfs
from corral.runtime.base import SandboxNotFound, SandboxSpec
from corral.runtime.cgroups import SandboxCgroup
from corral.runtime.process import ProcessRuntime, _cgroup_of
from corral.runtime.statedir import Running
from tests.runtime.conftest import RuntimeFactory


def _record(runtime: ProcessRuntime, sandbox_id: str) -> Running:
    record = runtime.statedir.load(sandbox_id)
    assert isinstance(record, Running)
    return record


@contextmanager
def _raw(runtime: ProcessRuntime, sandbox_id: str) -> Iterator[socket.socket]:
    """A connection of our own to the init's channel, as a broken or hostile runtime would hold."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    with guest.short_path(runtime.statedir.dir(sandbox_id)) as where:
        sock.connect(f"{where}/{guest.SOCKET_NAME}")
    try:
        yield sock
    finally:
        sock.close()


def _rights(fds: list[int]) -> list[tuple[int, int, bytes]]:
    return [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds).tobytes())] if fds else []


def _init_fds(record: Running) -> int:
    return len(os.listdir(f"/proc/{record.init.pid}/fd"))


async def _still_serves(runtime: ProcessRuntime, sandbox_id: str) -> None:
    assert procfs.is_alive(_record(runtime, sandbox_id).init), "the init died"
    result = await runtime.exec(sandbox_id, ["sh", "-c", "echo ok; echo $PPID"])
    assert (result.exit_code, result.stdout) == (0, "ok\n1\n"), result  # run by the init, pid 1


async def test_commands_run_through_the_init(
    process_runtime: ProcessRuntime, eventually: Callable[..., Awaitable[bool]]
) -> None:
    await process_runtime.start(SandboxSpec(id="chan", memory_mb=64, env={"FROM_CREATE": "c"}))
    result = await process_runtime.exec(
        "chan",
        ["sh", "-c", 'echo "$FROM_CREATE$FROM_EXEC $(pwd) $PPID"; echo e >&2; exit 7'],
        env={"FROM_EXEC": "x"},
        cwd="/tmp",
    )
    assert (result.exit_code, result.stdout, result.stderr) == (7, "cx /tmp 1\n", "e\n")
    assert "chan" in process_runtime._channels  # not the launcher
    await commands_behave(process_runtime, "chan", eventually)


async def commands_behave(
    runtime: ProcessRuntime, sandbox_id: str, eventually: Callable[..., Awaitable[bool]]
) -> None:
    """Exit codes and errors as the launcher gives them, input streamed in, a signal to the command's
    whole group: whatever serves the sandbox's channel."""
    killed = await runtime.exec(sandbox_id, ["sh", "-c", "kill -TERM $$"])
    assert killed.exit_code == 128 + signal.SIGTERM
    missing = await runtime.exec(sandbox_id, ["no-such-command"])
    assert missing.exit_code == 127 and "command not found" in missing.stderr
    gone_cwd = await runtime.exec(sandbox_id, ["true"], cwd="/no/such/dir")
    assert gone_cwd.exit_code == 125 and "/no/such/dir" in gone_cwd.stderr
    # Input, and a signal to the command's whole group, through the same connection.
    spawned = await runtime.spawn(
        sandbox_id, ["sh", "-c", "read line; echo got $line; sleep 60 & wait"], stdin=True
    )
    assert spawned.stdin is not None
    spawned.stdin.write(b"hello\n")
    await spawned.stdin.drain()
    assert await spawned.stdout.readline() == b"got hello\n"
    spawned.signal(signal.SIGKILL)
    assert await asyncio.wait_for(spawned.wait(), 10) == 128 + signal.SIGKILL

    # The sleep in its group went too (killed with it; reaped once it has exited).
    async def no_sleep() -> bool:
        left = await runtime.exec(sandbox_id, ["sh", "-c", "cat /proc/[0-9]*/comm"])
        return "sleep" not in left.stdout

    assert await eventually(no_sleep)


async def test_a_timeout_kills_the_command_group(process_runtime: ProcessRuntime) -> None:
    await process_runtime.start(SandboxSpec(id="slow", memory_mb=64))
    result = await process_runtime.exec("slow", ["sh", "-c", "sleep 60 & sleep 60"], timeout_s=0.5)
    assert result.timed_out and result.exit_code == 137
    await _still_serves(process_runtime, "slow")


async def test_the_init_survives_garbage_and_oversize_messages(process_runtime: ProcessRuntime) -> None:
    await process_runtime.start(SandboxSpec(id="garbage", memory_mb=64))
    await _still_serves(process_runtime, "garbage")
    record = _record(process_runtime, "garbage")
    baseline = _init_fds(record)
    header = guest.MESSAGE.pack(guest.MAGIC, guest.EXEC, 1, 0)
    devnull = os.open(os.devnull, os.O_RDONLY)
    spec = launcher.memfd("spec", launcher.encode(["true"], {}, "/"))
    bad: list[tuple[bytes, list[int]]] = [
        (b"", []),
        (b"x", []),
        (header[:15], [spec, devnull, devnull, devnull]),
        (header + b"!", [spec, devnull, devnull, devnull]),  # one byte too long
        (b"\xff" * 16, [spec, devnull, devnull, devnull]),  # not the magic
        (guest.MESSAGE.pack(guest.MAGIC, 99, 1, 0), []),  # no such request
        (header, []),  # an exec without its descriptors
        (header, [spec, devnull, devnull]),  # one short
        (header, [spec] + [devnull] * 20),  # too many
        (guest.MESSAGE.pack(guest.MAGIC, guest.SIGNAL, 1, 0), []),  # no signal 0
        (guest.MESSAGE.pack(guest.MAGIC, guest.SIGNAL, 1, 1000), []),
        (guest.MESSAGE.pack(guest.MAGIC, guest.SIGNAL, 1, 9), [devnull]),  # a signal with a descriptor
        (os.urandom(200_000), []),  # oversize
    ]
    try:
        for message, fds in bad:
            with _raw(process_runtime, "garbage") as sock:
                try:
                    sock.sendmsg([message], _rights(fds))
                except OSError:
                    continue  # more than the socket takes: refused before the init sees it
                sock.settimeout(5)
                assert sock.recv(64) == b"", message[:20]  # the init hung up on it, answering nothing
    finally:
        os.close(devnull)
        os.close(spec)
    await _still_serves(process_runtime, "garbage")
    # Every descriptor it was sent was closed again.
    assert _init_fds(record) <= baseline


async def test_a_bad_spec_ends_only_its_own_child(process_runtime: ProcessRuntime) -> None:
    await process_runtime.start(SandboxSpec(id="badspec", memory_mb=64))
    await _still_serves(process_runtime, "badspec")
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    specs = [b"garbage", b"corral-exec-1\0/\0" + b"9" * 40 + b"\0", b"", b"\0" * 5000]
    try:
        with _raw(process_runtime, "badspec") as sock:
            sock.settimeout(10)
            for number, data in enumerate(specs, start=1):
                spec = launcher.memfd("spec", data)
                try:
                    sock.sendmsg(
                        [guest.MESSAGE.pack(guest.MAGIC, guest.EXEC, number, 0)],
                        _rights([spec, out_r, out_w, err_w]),
                    )
                finally:
                    os.close(spec)
                answers = [guest.MESSAGE.unpack(sock.recv(64)) for _ in range(2)]
                assert [(kind, request) for _m, kind, request, _v in answers] == [
                    (guest.STARTED, number),
                    (guest.EXITED, number),
                ]
                assert answers[1][3] == 125  # the child refused the spec, as the launcher would
            # A directory as the spec: a read error, the same refusal.
            directory = os.open("/", os.O_RDONLY | os.O_DIRECTORY)
            try:
                sock.sendmsg(
                    [guest.MESSAGE.pack(guest.MAGIC, guest.EXEC, 99, 0)],
                    _rights([directory, out_r, out_w, err_w]),
                )
            finally:
                os.close(directory)
            answers = [guest.MESSAGE.unpack(sock.recv(64)) for _ in range(2)]
            assert answers[1][1:] == (guest.EXITED, 99, 125)
    finally:
        for fd in (out_r, out_w, err_w):
            os.close(fd)
    assert b"spec" in os.read(err_r, 65536)
    os.close(err_r)
    await _still_serves(process_runtime, "badspec")


async def test_the_decoder_survives_a_fuzz(process_runtime: ProcessRuntime) -> None:
    """Random messages (lengths around the real one, real and random headers, 0-8 descriptors), a
    few hundred on shared and fresh connections: the init hangs up on bad ones, never dies."""
    await process_runtime.start(SandboxSpec(id="fuzz", memory_mb=64))
    record = _record(process_runtime, "fuzz")
    await _still_serves(process_runtime, "fuzz")
    baseline = _init_fds(record)
    rng = random.Random(25)
    devnull = os.open(os.devnull, os.O_RDWR)
    try:
        sock: socket.socket | None = None
        for _ in range(400):
            if sock is None or rng.random() < 0.3:
                if sock is not None:
                    sock.close()
                with guest.short_path(process_runtime.statedir.dir("fuzz")) as where:
                    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
                    sock.connect(f"{where}/{guest.SOCKET_NAME}")
                sock.setblocking(False)
            size = rng.choice([0, 1, 15, 16, 16, 16, 17, 64, 4096])
            message = bytearray(rng.randbytes(size))
            if size >= 16 and rng.random() < 0.7:  # mostly well-framed, so the checks past the magic run
                kind = rng.choice([guest.EXEC, guest.SIGNAL, 0, 3, 0xFFFFFFFF])
                value = rng.choice([0, 9, 64, 65, -1, 2**31 - 1])
                message[:16] = guest.MESSAGE.pack(guest.MAGIC, kind, rng.getrandbits(32), value)
            fds = [devnull] * rng.choice([0, 0, 1, 3, 4, 5, 8])
            try:
                sock.sendmsg([bytes(message)], _rights(fds))
            except OSError:
                sock.close()
                sock = None
        if sock is not None:
            sock.close()
    finally:
        os.close(devnull)
    # What the well-formed execs among them started (stdio /dev/null, specs that are not specs) ended.
    await _still_serves(process_runtime, "fuzz")
    assert _init_fds(record) <= baseline, [
        os.readlink(f"/proc/{record.init.pid}/fd/{f}") for f in os.listdir(f"/proc/{record.init.pid}/fd")
    ]


async def test_a_flood_that_never_reads_costs_only_its_connection(process_runtime: ProcessRuntime) -> None:
    await process_runtime.start(SandboxSpec(id="flood", memory_mb=128))
    await _still_serves(process_runtime, "flood")
    record = _record(process_runtime, "flood")
    baseline = _init_fds(record)
    devnull = os.open(os.devnull, os.O_RDWR)
    spec = launcher.memfd("spec", launcher.encode(["true"], {}, "/"))
    sent = 0
    try:
        with _raw(process_runtime, "flood") as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1)  # its answers soon find no room
            sock.settimeout(5)
            with pytest.raises(OSError):  # the init hangs up on a runtime that never reads
                for sent in range(1, 5001):
                    sock.sendmsg(
                        [guest.MESSAGE.pack(guest.MAGIC, guest.EXEC, sent, 0)],
                        _rights([spec, devnull, devnull, devnull]),
                    )
            # Also many connections at once: past its few slots it closes the newest at once.
            extra = [socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) for _ in range(20)]
            with guest.short_path(process_runtime.statedir.dir("flood")) as where:
                for other in extra:
                    other.connect(f"{where}/{guest.SOCKET_NAME}")
            for other in extra:
                other.close()
    finally:
        os.close(spec)
        os.close(devnull)
    assert sent > 1
    await _still_serves(process_runtime, "flood")
    assert _init_fds(record) <= baseline


async def test_a_tenant_cannot_reach_the_channel(process_runtime: ProcessRuntime) -> None:
    await process_runtime.start(SandboxSpec(id="reach", memory_mb=64))
    channel_path = process_runtime.statedir.dir("reach") / guest.SOCKET_NAME
    script = (
        "ls /proc/1/fd 2>&1; "
        "stat /proc/1/fd/3 2>&1; "
        f"ls -d {channel_path} 2>&1; "
        "find / -xdev -type s 2>/dev/null; "  # every unix socket file the sandbox can see
        "cat /proc/net/unix"
    )
    result = await process_runtime.exec("reach", ["sh", "-c", script])
    out = result.stdout
    assert "Permission denied" in out.splitlines()[0]  # the init's descriptors are not the tenant's
    assert "Permission denied" in out.splitlines()[1]
    assert "No such file" in out.splitlines()[2]  # no path to it exists inside
    seen = "\n".join(out.splitlines()[3:])  # the sockets and unix addresses it can see
    assert guest.SOCKET_NAME not in seen and str(process_runtime.statedir.root) not in seen
    # Nor through an address of its own: the socket is a path one, in the host's state directory.
    reached = await process_runtime.exec(
        "reach",
        [
            "python3",
            "-c",
            f"import socket; s=socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET); s.connect({str(channel_path)!r})",
        ],
    )
    assert reached.exit_code != 0 and "FileNotFoundError" in reached.stderr


async def test_a_dead_init_ends_its_commands_and_the_sandbox(
    process_runtime: ProcessRuntime, eventually: Callable[..., Awaitable[bool]]
) -> None:
    await process_runtime.start(SandboxSpec(id="doomed", memory_mb=64))
    record = _record(process_runtime, "doomed")
    running = asyncio.create_task(process_runtime.exec("doomed", ["sleep", "60"], timeout_s=30))
    await asyncio.sleep(0.3)
    os.kill(record.init.pid, signal.SIGKILL)
    result = await asyncio.wait_for(running, 10)
    assert result.exit_code == 137 and not result.timed_out

    async def gone() -> bool:  # once bubblewrap's monitor has reaped it
        return "doomed" not in [h.id for h in await process_runtime.list()]  # reported stopped, cleaned up

    assert await eventually(gone)
    with pytest.raises(SandboxNotFound):
        await process_runtime.exec("doomed", ["true"])
    assert not process_runtime.statedir.dir("doomed").exists()


async def test_another_runtime_object_reconnects(
    process_runtime: ProcessRuntime, make_process_runtime: RuntimeFactory
) -> None:
    await process_runtime.start(SandboxSpec(id="adopted", memory_mb=64))
    await _still_serves(process_runtime, "adopted")
    again = make_process_runtime()  # a restarted agent over the same root
    assert [h.id for h in await again.list()] == ["adopted"]
    await _still_serves(again, "adopted")
    assert "adopted" in again._channels
    await _still_serves(process_runtime, "adopted")  # both connections served


async def test_without_the_channel_the_launcher_runs_commands(make_process_runtime: RuntimeFactory) -> None:
    runtime = make_process_runtime(guest_channel=False)
    await runtime.start(SandboxSpec(id="plain", memory_mb=64))
    assert not (runtime.statedir.dir("plain") / guest.SOCKET_NAME).exists()
    result = await runtime.exec("plain", ["sh", "-c", "echo $PPID"])
    assert result.stdout == "0\n" and not runtime._channels  # its parent, the launcher, is outside


async def test_a_sandbox_frozen_under_a_starting_command_holds_it_only_to_its_timeout(
    process_runtime: ProcessRuntime,
    eventually: Callable[..., Awaitable[bool]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The race of a pause between the exec's check and the init's answer: the exec ends at its
    timeout, and what the init starts once thawed is killed, not left running unwatched."""
    await process_runtime.start(SandboxSpec(id="racy", memory_mb=64))
    await _still_serves(process_runtime, "racy")  # connected
    cgroup = _cgroup_of(_record(process_runtime, "racy"))
    assert cgroup is not None
    cgroup.freeze()
    with monkeypatch.context() as patched:
        patched.setattr(SandboxCgroup, "frozen", lambda self: False)  # the check ran before the pause
        result = await process_runtime.exec("racy", ["sh", "-c", "sleep 4242"], timeout_s=1)
    assert result.timed_out and result.exit_code == 137  # (its note is the patched check's: not paused)
    cgroup.thaw()
    # Served after the request and the kill behind it, on the same connection: both were read.
    await _still_serves(process_runtime, "racy")

    def cmdline(pid: int) -> bytes:
        try:
            return Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            return b""

    async def nothing_left() -> bool:
        return not any(b"4242" in cmdline(pid) for pid in cgroup.pids())

    assert await eventually(nothing_left)
