"""Pipe transports that own their descriptor: read and write ends of a child's pipes, watched with
``add_reader``/``add_writer`` and closed exactly once, here.

The loop's own pipe transports take a file object, and (uvloop's) close its descriptor on their own
schedule while the file object may close the same number again when it is collected: by then the
number may be another thread's new descriptor (a fork's error pipe, an accepted socket). These never
share a descriptor with anything else. Flow control is the loop's usual contract: the reading side
pauses when its protocol asks (a ``StreamReader`` over its limit), the writing side tells its
protocol to pause past a high-water mark.
"""

from __future__ import annotations

import asyncio
import errno
import os

_CHUNK = 64 * 1024
_HIGH_WATER = 64 * 1024


class ReadPipe(asyncio.ReadTransport):
    def __init__(self, loop: asyncio.AbstractEventLoop, fd: int, protocol: asyncio.Protocol) -> None:
        super().__init__()
        os.set_blocking(fd, False)
        self._loop, self._fd, self._protocol = loop, fd, protocol
        self._closed = self._paused = False
        protocol.connection_made(self)
        loop.add_reader(fd, self._ready)

    def _ready(self) -> None:
        try:
            data = os.read(self._fd, _CHUNK)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            if exc.errno != errno.EIO:
                self._lose(exc)
                return
            data = b""  # a terminal's master once no process holds its slave: its end of file
        if data:
            self._protocol.data_received(data)
        else:
            self._protocol.eof_received()
            self._lose(None)

    def pause_reading(self) -> None:
        if not self._closed and not self._paused:
            self._paused = True
            self._loop.remove_reader(self._fd)

    def resume_reading(self) -> None:
        if not self._closed and self._paused:
            self._paused = False
            self._loop.add_reader(self._fd, self._ready)

    def is_reading(self) -> bool:
        return not self._closed and not self._paused

    def close(self) -> None:
        self._lose(None)

    def is_closing(self) -> bool:
        return self._closed

    def _lose(self, exc: Exception | None) -> None:
        if self._closed:
            return
        self._closed = True
        self._loop.remove_reader(self._fd)
        os.close(self._fd)
        self._loop.call_soon(self._protocol.connection_lost, exc)


class WritePipe(asyncio.WriteTransport):
    def __init__(self, loop: asyncio.AbstractEventLoop, fd: int, protocol: asyncio.BaseProtocol) -> None:
        super().__init__()
        os.set_blocking(fd, False)
        self._loop, self._fd, self._protocol = loop, fd, protocol
        self._buffer = bytearray()
        self._closed = self._closing = self._paused = False
        protocol.connection_made(self)

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._closed or self._closing or not data:
            return
        if not self._buffer:
            try:
                sent = os.write(self._fd, data)
            except (BlockingIOError, InterruptedError):
                sent = 0
            except OSError as exc:  # the reader is gone (EPIPE): what is left is dropped
                self._lose(exc)
                return
            data = memoryview(data)[sent:]
            if not data:
                return
            self._loop.add_writer(self._fd, self._flush)
        self._buffer += data
        if not self._paused and len(self._buffer) > _HIGH_WATER:
            self._paused = True
            self._protocol.pause_writing()

    def _flush(self) -> None:
        try:
            sent = os.write(self._fd, self._buffer)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._lose(exc)
            return
        del self._buffer[:sent]
        if self._paused and len(self._buffer) <= _HIGH_WATER // 4:
            self._paused = False
            self._protocol.resume_writing()
        if not self._buffer:
            self._loop.remove_writer(self._fd)
            if self._closing:
                self._lose(None)

    def get_write_buffer_size(self) -> int:
        return len(self._buffer)

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        self.close()

    def close(self) -> None:
        if self._buffer:
            self._closing = True  # closed once the buffer is written
        else:
            self._lose(None)

    def abort(self) -> None:
        self._lose(None)

    def is_closing(self) -> bool:
        return self._closed or self._closing

    def _lose(self, exc: Exception | None) -> None:
        if self._closed:
            return
        self._closed = True
        self._buffer.clear()
        self._loop.remove_writer(self._fd)
        os.close(self._fd)
        self._loop.call_soon(self._protocol.connection_lost, exc)
