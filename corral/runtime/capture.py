"""Bounded capture of a child's output: keep the first ``limit`` bytes, drain (and drop) at most
``drop_budget`` more so an ordinary chatty command never blocks on a full pipe, then close the read
end, so a writer that goes on gets EPIPE/SIGPIPE as it would under ``cmd | head``. Reading costs the
host's CPU, outside any sandbox's limit: output nobody keeps is not read without bound."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

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
