"""The Sentry's control socket: how the gVisor runtime starts, waits for and signals a sandbox's
commands without a ``runsc exec`` process per command (a Go program, about 21 ms to start here).

runsc's sandbox process listens on an abstract unix socket named after the container,
``@runsc-sandbox.<cid>`` (with a trailing NUL), in the network namespace ``runsc create`` ran in: the
host's, never the guest's. Its protocol (gVisor's urpc) is one JSON object per call,
``{"method": ..., "arg": ...}``, descriptors riding beside it as ``SCM_RIGHTS``, answered by
``{"success": ..., "err": ..., "result": ...}``; calls on one connection are served in turn, so a
command's start and its wait share one connection, and a signal opens its own.

What this sends is what ``runsc exec`` sends for a process spec (``ExecuteAsync`` with the command's
argv, environment, directory, ids and no capabilities, then ``WaitPID``), traced off this host's
runsc; the Sentry resolves ``argv[0]`` on the command's ``PATH``. A terminal's command stays on
``runsc exec``: the host terminal's signals (a typed ^C) reach the process whose controlling terminal
it is, and only runsc forwards them inside.
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import json
import os
import signal
import socket
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from corral.runtime import child, guest

_CALL_TIMEOUT_S = 30.0
# What a command is reported as when its sandbox's Sentry has gone: everything inside was killed.
_LOST = 128 + signal.SIGKILL
# An answer is a few dozen bytes; a peer sending more is not the Sentry.
_ANSWER_LIMIT = 64 * 1024
_NO_CAPS = {
    "PermittedCaps": 0,
    "InheritableCaps": 0,
    "EffectiveCaps": 0,
    "BoundingCaps": 0,
    "AmbientCaps": 0,
}


class SentryGone(Exception):
    """The sandbox's control socket refused the connection or closed it: the Sentry is not there."""


class SentryRefused(Exception):
    """The Sentry answered the call with an error (``err``, its words)."""


@dataclass(frozen=True, slots=True)
class Control:
    """Where one container's Sentry listens: ``state_dir`` is runsc's ``--root``."""

    cid: str
    state_dir: Path

    async def open(self) -> Connection:
        """A new connection. runsc releases from 2023 on listen on a file in their state directory,
        ``runsc-<cid>.sock``; older ones (Debian bookworm's) on the abstract socket."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        sock.setblocking(False)
        loop = asyncio.get_running_loop()
        try:
            name = f"runsc-{self.cid}.sock"
            if (self.state_dir / name).exists():
                with guest.short_path(self.state_dir) as where:  # a socket's path must fit 108 bytes
                    await loop.sock_connect(sock, f"{where}/{name}")
            else:
                await loop.sock_connect(sock, b"\0runsc-sandbox." + self.cid.encode() + b"\0")
        except OSError as exc:
            sock.close()
            raise SentryGone(f"the sandbox's Sentry is not listening: {exc}") from None
        return Connection(sock)


def exec_args(
    cid: str,
    argv: Sequence[str],
    env: Mapping[str, str],
    cwd: str,
    *,
    uid: int,
    gid: int,
) -> dict[str, Any]:
    """``ExecuteAsync``'s argument for a command on pipes, as the sandbox's user, without capabilities."""
    return {
        "filename": "",
        "argv": list(argv),
        "envv": [f"{k}={v}" for k, v in env.items()],
        "MountNamespace": None,
        "wd": cwd,
        "KUID": uid,
        "KGID": gid,
        "ExtraKGIDs": [],
        "Capabilities": _NO_CAPS,
        "StdioIsPty": False,
        "GuestFDs": [0, 1, 2],  # what the payload's descriptors become (newer releases ask; older ignore)
        "ContainerID": cid,
        "PIDNamespace": None,
        "Limits": None,
    }


def exit_code(wait_status: int) -> int:
    """A wait status as a shell reports it: exited with N -> N, killed by signal N -> 128 + N."""
    code = os.waitstatus_to_exitcode(wait_status)
    return 128 - code if code < 0 else code


class Connection:
    """One connection to a sandbox's control socket, its calls answered in turn."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._loop = asyncio.get_running_loop()
        self._decoder = json.JSONDecoder()

    def close(self) -> None:
        self._sock.close()

    async def call(self, method: str, arg: Mapping[str, Any], fds: Sequence[int] = ()) -> Any:
        """``method``'s result; ``fds`` are sent with the call (the Sentry takes its own copies)."""
        data = json.dumps({"method": method, "arg": arg}, separators=(",", ":")).encode()
        try:
            await asyncio.wait_for(self._send(data, fds), _CALL_TIMEOUT_S)
        except OSError as exc:
            raise SentryGone(f"the sandbox's Sentry closed its control socket: {exc}") from None
        answer = await self._answer()
        if not isinstance(answer, dict) or not answer.get("success"):
            err = answer.get("err") if isinstance(answer, dict) else None
            raise SentryRefused(str(err or "no answer"))
        return answer.get("result")

    async def _send(self, data: bytes, fds: Sequence[int]) -> None:
        rights = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds).tobytes())] if fds else []
        while True:
            try:
                sent = self._sock.sendmsg([data], rights)
                break
            except BlockingIOError:
                await self._writable()
        # The descriptors went with the first bytes; the rest of a long call follows them.
        if sent < len(data):
            await self._loop.sock_sendall(self._sock, data[sent:])

    async def _writable(self) -> None:
        ready: asyncio.Future[None] = self._loop.create_future()
        fd = self._sock.fileno()

        def wake() -> None:
            if not ready.done():
                ready.set_result(None)

        self._loop.add_writer(fd, wake)
        try:
            await ready
        finally:
            self._loop.remove_writer(fd)

    async def _answer(self) -> Any:
        """The next JSON object the Sentry writes; no timeout (a wait lasts as long as its command)."""
        buffer = b""
        while True:
            try:
                chunk = await self._loop.sock_recv(self._sock, 4096)
            except OSError as exc:
                raise SentryGone(f"the sandbox's Sentry closed its control socket: {exc}") from None
            if not chunk:
                raise SentryGone("the sandbox's Sentry closed its control socket")
            buffer += chunk
            if len(buffer) > _ANSWER_LIMIT:
                raise SentryGone("the sandbox's control socket answered more than a call's answer")
            with contextlib.suppress(ValueError):  # not whole yet (a UTF-8 or JSON prefix)
                value, _ = self._decoder.raw_decode(buffer.decode())
                return value


class SentryCommand:
    """A command the Sentry started: its pid inside, its streams, its exit."""

    def __init__(
        self,
        control: Control,
        conn: Connection,
        pid: int,
        streams: tuple[asyncio.StreamReader, asyncio.StreamReader, asyncio.StreamWriter | None],
    ) -> None:
        self._control = control
        self.pid = pid
        self.stdout, self.stderr, self.stdin = streams
        self._exited = asyncio.ensure_future(_exit_of(conn, control.cid, pid))

    async def wait(self) -> int:
        """The shell's exit code (128+N for signal N); 128+SIGKILL if the Sentry went first (a stopped
        sandbox: everything in it was killed)."""
        return await asyncio.shield(self._exited)

    def signal(self, sig: int) -> None:
        """``sig`` to the command inside; nothing once it has exited."""
        if not self._exited.done():
            signal_soon(self._control, self.pid, sig)


async def start(control: Control, args: Mapping[str, Any], *, stdin: bool) -> SentryCommand:
    """Start a command (``args`` from :func:`exec_args`) with pipes for its output, and for its input
    if asked. Raises :class:`SentryRefused` (no such program, a bad directory) or :class:`SentryGone`."""
    with child.handing_over() as (ours, theirs):
        pipes = child.command_pipes(ours, theirs, stdin=stdin)
        conn = await control.open()
        try:
            pid = await conn.call("containerManager.ExecuteAsync", args, pipes.given)
            if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
                raise SentryRefused(f"the Sentry answered a start with {pid!r}, not a pid")
        except BaseException:
            conn.close()
            raise
    return SentryCommand(control, conn, pid, pipes.streams(asyncio.get_running_loop()))


async def _exit_of(conn: Connection, cid: str, pid: int) -> int:
    try:
        status = await conn.call("containerManager.WaitPID", {"PID": pid, "CID": cid})
    except (SentryGone, SentryRefused):
        return _LOST
    finally:
        conn.close()
    if not isinstance(status, int) or isinstance(status, bool) or not 0 <= status < 1 << 32:
        return _LOST
    return exit_code(struct.unpack("=i", struct.pack("=I", status))[0])


# Signals on their way, held so that none is collected before it is sent.
_sending: set[asyncio.Task[None]] = set()


def signal_soon(control: Control, pid: int, sig: int) -> None:
    """``sig`` to the process ``pid`` inside, sent in the background (nothing if it has gone)."""
    task = asyncio.ensure_future(_send_signal(control, pid, sig))
    _sending.add(task)
    task.add_done_callback(_sending.discard)


async def _send_signal(control: Control, pid: int, sig: int) -> None:
    with contextlib.suppress(SentryGone, SentryRefused, TimeoutError):
        conn = await asyncio.wait_for(control.open(), _CALL_TIMEOUT_S)
        try:
            signal_ = {"CID": control.cid, "Signo": sig, "PID": pid, "Mode": 0}
            await asyncio.wait_for(
                conn.call("containerManager.Signal", signal_),
                _CALL_TIMEOUT_S,
            )
        finally:
            conn.close()
