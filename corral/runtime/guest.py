"""The guest channel: how the runtime asks a sandbox's init (the launcher's ``init`` mode, its pid 1) to
run a command, instead of starting a host-side launcher that enters the sandbox's namespaces.

The runtime binds a ``SOCK_SEQPACKET`` unix socket in the sandbox's state directory (0700, root's: no
path to it exists inside the sandbox), listens on it before bubblewrap starts, and hands the listening
descriptor to the init, which accepts the runtime's connections on it. The init is not dumpable, so no
process of the sandbox can take its descriptors. One connection per sandbox carries every command,
multiplexed by a request id.

Every message is 16 bytes in the host's byte order, ``magic, type, id, value``:

* ``EXEC`` (runtime -> init), with four descriptors: the spec (a memfd, the launcher's spec encoding,
  see :mod:`corral.runtime.launcher`), stdin, stdout, stderr. The init forks; the child, already the
  sandbox's user in every namespace with no capability, ``no_new_privs`` and the seccomp filter (all of
  them the init's), parses the spec and execs. Tenant input is read only by that child. ``value``:
  the user inside to run it as, read by an image sandbox's command server only (see below).
* ``SIGNAL`` (runtime -> init), ``value`` a signal: sent to the command's process group.
* ``STARTED`` (``value`` its pid inside), ``FAILED`` (``value`` an errno), ``EXITED`` (``value`` the
  shell's code, 128+N for signal N) (init -> runtime).

A connection the init closes, or a dead init, ends every command of it with 137 (the kernel killed
them with the sandbox's pid namespace).

An image's sandbox serves the same protocol from a *command server* (the launcher's ``serve-root``
mode) instead of its init, whose ``no_new_privs`` would keep the image's setuid ``sudo`` from working:
the host starts it into the sandbox as ``exec-root`` enters it, and each of its children finishes
what ``exec-root`` does, as the user ``value`` names (see :mod:`corral.runtime.commands`).
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import itertools
import os
import signal
import socket
import struct
from collections.abc import Iterator
from pathlib import Path

from corral.runtime import child, launcher

MAGIC = 0x31637263
EXEC, SIGNAL = 1, 2
STARTED, EXITED, FAILED = 1, 2, 3
MESSAGE = struct.Struct("=IIIi")  # the C struct: native order, no padding
SOCKET_NAME = "channel"
_BACKLOG = 8
# What the commands of a lost connection are reported as: the init is gone, and with it its pid
# namespace, every process of which the kernel SIGKILLed.
_LOST = 128 + signal.SIGKILL


class ChannelLost(Exception):
    """The init did not take the command: its connection is gone (the sandbox stopped) or it refused.
    ``sent``: the request had reached the init before the loss, so it may have started the command;
    starting it another way would run it twice."""

    sent = False


def listen(directory: Path, name: str = SOCKET_NAME) -> socket.socket:
    """A listening socket at ``directory/name`` (``channel`` unless told), for the init to inherit (the
    caller closes it once the init has it)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
    try:
        with short_path(directory) as where:
            sock.bind(f"{where}/{name}")
            os.chmod(f"{where}/{name}", 0o600)  # as every file of the state directory
        sock.listen(_BACKLOG)
    except BaseException:
        sock.close()
        raise
    return sock


@contextlib.contextmanager
def short_path(directory: Path) -> Iterator[str]:
    """``directory`` as a path short enough for a unix socket's address (108 bytes): through this
    process's descriptor of it when its own path is longer."""
    fd = os.open(directory, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        yield f"/proc/self/fd/{fd}"
    finally:
        os.close(fd)


class InitCommand:
    """A command the init started: what :mod:`corral.runtime.child`'s ``Child`` offers the runtime."""

    def __init__(
        self,
        channel: Channel,
        request: int,
        pid: int,
        exited: asyncio.Future[int],
        streams: tuple[asyncio.StreamReader, asyncio.StreamReader, asyncio.StreamWriter | None],
    ) -> None:
        self._channel = channel
        self._request = request
        self.pid = pid  # inside the sandbox's pid namespace
        self._exited = exited
        self.stdout, self.stderr, self.stdin = streams

    @property
    def returncode(self) -> int | None:
        return self._exited.result() if self._exited.done() else None

    async def wait(self) -> int:
        """The shell's exit code (128+N for signal N) once the command has exited."""
        return await asyncio.shield(self._exited)

    def signal(self, sig: int) -> None:
        """To the command's process group, through the init; nothing once it has exited."""
        if not self._exited.done():
            self._channel.send_signal(self._request, sig)


class Channel:
    """One connection to a sandbox's init, serving every command of the sandbox from one loop."""

    def __init__(self, sock: socket.socket, loop: asyncio.AbstractEventLoop) -> None:
        self._sock = sock
        self.loop = loop
        self._ids = itertools.count(1)
        # Per request: its start's answer and its exit; then, once started, its exit alone.
        self._starting: dict[int, tuple[asyncio.Future[int], asyncio.Future[int]]] = {}
        self._running: dict[int, asyncio.Future[int]] = {}
        self.closed = False
        loop.add_reader(sock.fileno(), self._readable)

    @classmethod
    def connect(cls, directory: Path) -> Channel | None:
        """A connection to the init listening in ``directory``, or None when it offers none (a sandbox
        started without the channel, or an init that has exited: the init alone holds the listening
        socket, bubblewrap's monitor closes its copy, so a dead init's is refused, and the
        connections of an init that dies end with it)."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        sock.setblocking(False)  # a full backlog is EAGAIN, never a wait on the loop
        try:
            with short_path(directory) as where:
                sock.connect(f"{where}/{SOCKET_NAME}")
        except OSError:
            sock.close()
            return None
        return cls(sock, asyncio.get_running_loop())

    async def start(self, spec: bytes, *, stdin: bool, user: int = 0) -> InitCommand:
        """Run the command ``spec`` encodes (see :func:`corral.runtime.launcher.encode`) with pipes for
        its output, and for its input if asked; as ``user`` (an id inside) if a command server serves
        the channel (an init's commands are its sandbox's one user). Raises :class:`ChannelLost` if
        the init did not."""
        if self.closed:
            raise ChannelLost("the sandbox's init closed its channel")
        ours: list[int] = []  # ours to close unless handed to a stream
        theirs: list[int] = []  # the init's, closed here once sent (it has its own copies)
        request = next(self._ids) & 0xFFFFFFFF
        started: asyncio.Future[int] = self.loop.create_future()
        exited: asyncio.Future[int] = self.loop.create_future()
        sent = False
        try:
            spec_fd = launcher.memfd("exec-spec", spec)
            theirs.append(spec_fd)
            pipes = child.command_pipes(ours, theirs, stdin=stdin)
            self._starting[request] = (started, exited)
            await self._send(MESSAGE.pack(MAGIC, EXEC, request, user), [spec_fd, *pipes.given])
            sent = True
            for fd in theirs:
                os.close(fd)
            theirs.clear()
            pid = await started
        except BaseException as exc:
            self._starting.pop(request, None)
            for fd in ours + theirs:
                os.close(fd)
            if sent and isinstance(exc, ChannelLost):
                exc.sent = True
            if sent and not isinstance(exc, ChannelLost):
                # Given up on (a timeout while the sandbox was frozen, a caller gone): the init reads
                # this after the request, so whatever it starts is killed rather than left unwatched.
                self.send_signal(request, signal.SIGKILL)
            raise
        return InitCommand(self, request, pid, exited, pipes.streams(self.loop))

    def send_signal(self, request: int, sig: int) -> None:
        if self.closed:
            return
        try:
            self._sock.send(MESSAGE.pack(MAGIC, SIGNAL, request, sig))
        except BlockingIOError:
            pass  # 16 bytes: only a stalled init leaves no room
        except OSError:
            self.close()  # the init closed its end: nothing of it is left to signal

    async def _send(self, message: bytes, fds: list[int]) -> None:
        rights = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds).tobytes())]
        while True:
            try:
                self._sock.sendmsg([message], rights)
                return
            except BlockingIOError:
                await self._writable()
            except OSError as exc:
                self.close()
                raise ChannelLost(f"the sandbox's init is gone: {exc}") from None

    async def _writable(self) -> None:
        ready: asyncio.Future[None] = self.loop.create_future()

        def wake() -> None:
            if not ready.done():
                ready.set_result(None)

        self.loop.add_writer(self._sock.fileno(), wake)
        try:
            await ready
        finally:
            self.loop.remove_writer(self._sock.fileno())

    def _readable(self) -> None:
        while not self.closed:
            try:
                data = self._sock.recv(MESSAGE.size + 1)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                data = b""
            if len(data) != MESSAGE.size or MESSAGE.unpack(data)[0] != MAGIC:
                self.close()  # its end of file, or not the init speaking
                return
            _magic, kind, request, value = MESSAGE.unpack(data)
            self._answer(kind, request, value)

    def _answer(self, kind: int, request: int, value: int) -> None:
        if kind in (STARTED, FAILED) and request in self._starting:
            started, exited = self._starting.pop(request)
            if kind == FAILED:
                _settle(started, ChannelLost(f"the sandbox's init could not start it: {os.strerror(value)}"))
            else:
                self._running[request] = exited
                _settle(started, value)
        elif kind == EXITED and request in self._running:
            _settle(self._running.pop(request), value)

    def close(self) -> None:
        """Forget the connection; commands still waiting end as the init's loss ends them."""
        if self.closed:
            return
        self.closed = True
        with contextlib.suppress(RuntimeError):  # the loop itself may be closed already
            self.loop.remove_reader(self._sock.fileno())
        self._sock.close()
        for started, exited in self._starting.values():
            _settle(started, ChannelLost("the sandbox's init closed its channel"))
            _settle(exited, _LOST)
        for exited in self._running.values():
            _settle(exited, _LOST)
        self._starting.clear()
        self._running.clear()


def _settle(future: asyncio.Future[int], outcome: int | BaseException) -> None:
    if future.done():
        return
    if isinstance(outcome, BaseException):
        future.set_exception(outcome)
    else:
        future.set_result(outcome)
