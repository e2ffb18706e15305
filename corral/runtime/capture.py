"""Bounded capture of a child's output: keep the first ``limit`` bytes, drain (and drop) the rest so
the child never blocks on a full pipe, and remember that something was dropped."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

DEFAULT_LIMIT = 1024 * 1024  # bytes kept per stream


@dataclass(slots=True)
class BoundedBuffer:
    limit: int = DEFAULT_LIMIT
    data: bytearray = field(default_factory=bytearray)
    truncated: bool = False

    def feed(self, chunk: bytes) -> None:
        room = self.limit - len(self.data)
        if room > 0:
            self.data += chunk[:room]
        if len(chunk) > room:
            self.truncated = True

    def text(self) -> str:
        # A cut may split a multi-byte character; replace rather than fail.
        return self.data.decode("utf-8", errors="replace")


async def drain(stream: asyncio.StreamReader, into: BoundedBuffer) -> None:
    """Read until EOF. Cancelling keeps what was read so far in ``into``."""
    while chunk := await stream.read(64 * 1024):
        into.feed(chunk)
