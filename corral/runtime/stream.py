"""A command running in a sandbox, seen while it runs: its output as it comes, its input as it is
written, its exit status when it ends. What long-lived callers (a streamed command, a file moved in or
out of a sandbox) get from :meth:`Runtime.spawn`, where ``exec`` only answers once it is over."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class PtySize:
    """A terminal's size in character cells."""

    rows: int
    cols: int


@dataclass(slots=True)
class Spawned:
    """Both output streams end at EOF; ``stdin`` is None when the command was given none (it reads
    /dev/null). ``wait`` answers the shell-convention exit code (128 + N when killed by signal N).
    ``signal`` reaches the command and everything it started; it is a no-op once it has exited.

    A command started on a terminal (``pty``) has it as its standard descriptors: ``stdout`` is all
    it writes, ``stderr`` is empty, ``stdin`` is what it reads as typed, and ``resize`` changes the
    terminal's size (the command gets its SIGWINCH); None for a command without one."""

    stdout: asyncio.StreamReader
    stderr: asyncio.StreamReader
    stdin: asyncio.StreamWriter | None
    wait: Callable[[], Awaitable[int]]
    signal: Callable[[int], None]
    resize: Callable[[PtySize], None] | None = None


def finished(exit_code: int, stdout: bytes = b"", stderr: bytes = b"") -> Spawned:
    """A command that has already ended, for runtimes that answer all at once."""
    out, err = asyncio.StreamReader(), asyncio.StreamReader()
    out.feed_data(stdout)
    out.feed_eof()
    err.feed_data(stderr)
    err.feed_eof()

    async def wait() -> int:
        return exit_code

    return Spawned(out, err, None, wait, lambda _sig: None)
