"""A host-side child (the launcher running one command in a sandbox) started off the event loop.

Under uvloop a subprocess is forked in the loop's own thread (libuv forks, it does not vfork), so
every request the process serves waits for a copy of the whole heap's page tables: milliseconds per
exec for a server's heap, and a stall for everyone in a burst of them (16 at once held a loop for
250 ms with a 200 MB heap; from the pool, 3 ms). Here the fork is made by a small pool of threads
(CPython's subprocess uses vfork, which copies nothing), the pipes are handed to the loop afterwards
(:mod:`corral.runtime.pipes`), and the exit is seen through a pidfd, so no thread is held while the
child runs. What the caller gets behaves as asyncio's ``Process`` for what the runtime uses of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from corral.runtime import pipes

# Forks in flight at once: each takes a millisecond or two, so a few threads keep up with any rate
# of execs the per-sandbox and per-tenant bounds let through.
SPAWN_THREADS = 4
_POOL = ThreadPoolExecutor(max_workers=SPAWN_THREADS, thread_name_prefix="corral-spawn")
# Kept per output stream before the reader must drain (asyncio's default).
_STREAM_LIMIT = 64 * 1024


@dataclass(eq=False)
class Child:
    """A started child: its output streams, its input (None when it reads /dev/null), its exit."""

    _popen: subprocess.Popen[bytes]
    stdout: asyncio.StreamReader
    stderr: asyncio.StreamReader
    stdin: asyncio.StreamWriter | None
    _exited: asyncio.Future[int]

    @property
    def pid(self) -> int:
        return self._popen.pid

    @property
    def returncode(self) -> int | None:
        return self._exited.result() if self._exited.done() else None

    async def wait(self) -> int:
        """The exit status (negative for a signal, as subprocess gives it), once the child has
        exited; its pipes may stay open in a grandchild and are not waited for."""
        return await asyncio.shield(self._exited)

    def signal(self, sig: int) -> None:
        """To the child's process group (its session: see :func:`start`)."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, sig)


async def start(
    argv: Sequence[str],
    *,
    env: Mapping[str, str],
    pass_fds: Sequence[int],
    stdin: bool,
    tty: tuple[int, int] | None = None,
) -> Child:
    """Start ``argv`` in a session of its own, with pipes for its output (and input, if asked); or,
    given a terminal's ``(master, slave)`` (both closed here), with the slave as its standard
    descriptors: its stdout is then what the master reads, its stdin written to the master, and its
    stderr empty (a terminal has one stream)."""
    loop = asyncio.get_running_loop()
    with handing_over() as (ours, theirs):
        if tty is None:
            out_r, out_w = pipe(ours, theirs)
            err_r, err_w = pipe(ours, theirs)
            in_r, in_w = pipe(theirs, ours) if stdin else (subprocess.DEVNULL, -1)
        else:
            ours.append(tty[0])
            theirs.append(tty[1])
            out_r, in_w = tty[0], -1
            if stdin:  # the input's transport owns a descriptor of its own
                in_w = os.dup(tty[0])
                ours.append(in_w)
            err_r = in_r = out_w = err_w = tty[1]
        popen = await loop.run_in_executor(
            _POOL,
            lambda: subprocess.Popen(
                argv,
                stdin=in_r,
                stdout=out_w,
                stderr=err_w,
                env=dict(env),
                cwd="/",
                start_new_session=True,
                pass_fds=tuple(pass_fds),
            ),
        )
    return Child(
        popen,
        reader(loop, out_r),
        reader(loop, err_r) if tty is None else ended(),
        writer(loop, in_w) if stdin else None,
        _watch_exit(loop, popen),
    )


def ended() -> asyncio.StreamReader:
    """A stream that is over before it began (a terminal's stderr)."""
    stream = asyncio.StreamReader()
    stream.feed_eof()
    return stream


def pipe(reader_side: list[int], writer_side: list[int]) -> tuple[int, int]:
    """A pipe, its read end noted in ``reader_side`` and its write end in ``writer_side``."""
    r, w = os.pipe2(os.O_CLOEXEC)
    reader_side.append(r)
    writer_side.append(w)
    return r, w


@dataclass(frozen=True, slots=True)
class Pipes:
    """A command's standard descriptors for another process to start it with (the sandbox's init, the
    Sentry): ``given`` are its ends, stdin (/dev/null when it takes no input), stdout, stderr; the
    rest are ours (``stdin`` -1 when it takes none)."""

    given: tuple[int, int, int]
    stdin: int
    stdout: int
    stderr: int

    def streams(
        self, loop: asyncio.AbstractEventLoop
    ) -> tuple[asyncio.StreamReader, asyncio.StreamReader, asyncio.StreamWriter | None]:
        """Our ends as streams, which own them from here on."""
        writer_ = writer(loop, self.stdin) if self.stdin >= 0 else None
        return reader(loop, self.stdout), reader(loop, self.stderr), writer_


def command_pipes(ours: list[int], theirs: list[int], *, stdin: bool) -> Pipes:
    """:class:`Pipes` with input if asked, each end noted in ``ours`` or ``theirs`` for the caller to
    close (theirs once handed over; ours only if the command does not start)."""
    if stdin:
        in_r, in_w = pipe(theirs, ours)
    else:
        in_r, in_w = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC), -1
        theirs.append(in_r)
    out_r, out_w = pipe(ours, theirs)
    err_r, err_w = pipe(ours, theirs)
    return Pipes((in_r, out_w, err_w), in_w, out_r, err_r)


@contextlib.contextmanager
def handing_over() -> Iterator[tuple[list[int], list[int]]]:
    """``(ours, theirs)`` for a block that starts a command: theirs are closed when it ends, whatever
    happened (the starter has its own copies by then); ours only if it fails (otherwise streams own
    them)."""
    ours: list[int] = []
    theirs: list[int] = []
    try:
        yield ours, theirs
    except BaseException:
        for fd in ours:
            os.close(fd)
        raise
    finally:
        for fd in theirs:
            os.close(fd)


def reader(loop: asyncio.AbstractEventLoop, fd: int) -> asyncio.StreamReader:
    """A stream over ``fd`` (a pipe's read end, a terminal's master), which it owns from here on."""
    stream = asyncio.StreamReader(limit=_STREAM_LIMIT)
    pipes.ReadPipe(loop, fd, asyncio.StreamReaderProtocol(stream))  # owns the descriptor from here on
    return stream


def writer(loop: asyncio.AbstractEventLoop, fd: int) -> asyncio.StreamWriter:
    """A stream writing to ``fd``, which it owns from here on."""
    protocol = _WriteProtocol(loop)
    return asyncio.StreamWriter(pipes.WritePipe(loop, fd, protocol), protocol, None, loop)


class _WriteProtocol(asyncio.streams.FlowControlMixin):
    """What a StreamWriter needs of its protocol: flow control for ``drain``, a waiter for
    ``wait_closed``."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(loop)
        self._closed: asyncio.Future[None] = loop.create_future()

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        if not self._closed.done():
            self._closed.set_result(None)

    def _get_close_waiter(self, stream: asyncio.StreamWriter) -> asyncio.Future[None]:
        return self._closed


def _watch_exit(loop: asyncio.AbstractEventLoop, popen: subprocess.Popen[bytes]) -> asyncio.Future[int]:
    """The child's exit status, reaped when its pidfd says it exited (the pidfd is readable from
    then on, also for a child that exited before this was set up)."""
    exited: asyncio.Future[int] = loop.create_future()
    pidfd = os.pidfd_open(popen.pid)

    def on_exit() -> None:
        code = popen.poll()
        if code is None:
            return  # not reaped yet: the pidfd stays readable and this runs again
        loop.remove_reader(pidfd)
        os.close(pidfd)
        if not exited.done():
            exited.set_result(code)

    loop.add_reader(pidfd, on_exit)
    return exited
