"""Bounded capture of a child's output: keep the first ``limit`` bytes, drain (and drop) at most
``drop_budget`` more so an ordinary chatty command never blocks on a full pipe, then close the read
end, so a writer that goes on gets EPIPE/SIGPIPE as it would under ``cmd | head``. Reading costs the
host's CPU, outside any sandbox's limit: output nobody keeps is not read without bound."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from corral.exec_result import ExecResult

DEFAULT_LIMIT = 1024 * 1024  # bytes kept per stream
# Bytes read and dropped past the kept ones, per stream, before the pipe is closed on the writer.
DROP_BUDGET = 4 * 1024 * 1024
_READ = 64 * 1024


@dataclass(slots=True)
class BoundedBuffer:
    limit: int = DEFAULT_LIMIT
    drop_budget: int = DROP_BUDGET
    data: bytearray = field(default_factory=bytearray)
    truncated: bool = False
    dropped: int = 0  # bytes read past ``limit`` and thrown away

    def feed(self, chunk: bytes) -> None:
        room = self.limit - len(self.data)
        if room > 0:
            self.data += chunk[:room]
        extra = len(chunk) - max(room, 0)
        if extra > 0:
            self.truncated = True
            self.dropped += extra

    @property
    def cut_off(self) -> bool:
        """The drop budget is spent: nothing more is read, the writer finds the pipe closed."""
        return self.dropped >= self.drop_budget

    def text(self) -> str:
        # A cut may split a multi-byte character; replace rather than fail.
        return self.data.decode("utf-8", errors="replace")


async def drain(stream: asyncio.StreamReader, into: BoundedBuffer) -> None:
    """Read until EOF, or until ``into`` is cut off (then the read end is closed). Cancelling keeps
    what was read so far in ``into``."""
    while chunk := await stream.read(_READ):
        into.feed(chunk)
        if into.cut_off:
            close_reader(stream)
            return


def close_reader(stream: asyncio.StreamReader) -> None:
    """Close the pipe ``stream`` reads from, so its writer gets EPIPE/SIGPIPE. A StreamReader has no
    public handle on its pipe; the transport it was given (``set_transport``) closes it, the loop's
    own way (never a second ``os.close`` of a number that may have been reused meanwhile)."""
    transport = getattr(stream, "_transport", None)
    if transport is not None and not transport.is_closing():  # uvloop's too: duck-typed
        transport.close()


class Capture:
    """A command's stdout and stderr, each drained into its own ``BoundedBuffer`` while it runs: what
    an exec answers with once the command is over."""

    def __init__(self, stdout: asyncio.StreamReader, stderr: asyncio.StreamReader, limit: int) -> None:
        self.out, self.err = BoundedBuffer(limit), BoundedBuffer(limit)
        self._readers = [
            asyncio.create_task(drain(stdout, self.out)),
            asyncio.create_task(drain(stderr, self.err)),
        ]

    async def settle(self, timeout_s: float) -> None:
        """Wait at most ``timeout_s`` for both streams to end; what is still unread then is left behind."""
        _done, pending = await asyncio.wait(self._readers, timeout=timeout_s)
        for task in pending:
            task.cancel()

    def cancel(self) -> None:
        for task in self._readers:
            task.cancel()

    def result(
        self, exit_code: int, started: float, *, timed_out: bool, note: str | None = None
    ) -> ExecResult:
        """The answer: ``exit_code``, the output kept, and the time since ``started`` (``time.monotonic()``)."""
        return ExecResult(
            exit_code=exit_code,
            stdout=self.out.text(),
            stderr=self.err.text(),
            duration_ms=(time.monotonic() - started) * 1000.0,
            truncated=self.out.truncated or self.err.truncated,
            timed_out=timed_out,
            note=note,
        )
