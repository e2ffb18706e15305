"""HTTP/1.1 heads and body framing (RFC 9112), as a relay that splices bytes needs them: a request
head read and judged whole, then its body passed on as it came, its end found by its framing (a
length, chunks, or none), and the answer's likewise.

Only plain requests are taken (:class:`Unrelayable` otherwise, and the full server answers them):
HTTP/1.1, an origin-form target, one Host, no upgrade and no ``Expect``, and a body framed one way
only (a ``Content-Length`` or ``Transfer-Encoding: chunked``, never both): whatever two parsers could
read two ways (request smuggling) never reaches the byte relay. A head is re-written from its parsed
fields, never copied, so nothing a caller puts in a line reaches the next hop unparsed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum

MAX_HEAD = 64 * 1024  # uvicorn's parser takes heads of about this size too
MAX_CHUNK_LINE = 1024
MAX_TRAILER = 16 * 1024

# What concerns one hop only (RFC 9110 7.6.1), never passed on; ``transfer-encoding`` with them where
# a body is re-framed (a relay that keeps the framing keeps the header).
HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
    }
)
SPLICE_DROPS = HOP_BY_HOP - {b"transfer-encoding"}

_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_VALUE = re.compile(rb"[\t\x20-\x7e\x80-\xff]*")
_TARGET = re.compile(rb"/[!-~]*")
_STATUS = re.compile(rb"HTTP/1\.([01]) ([1-9][0-9][0-9])(?: ([\t\x20-\x7e\x80-\xff]*))?")
_DIGITS = re.compile(rb"[0-9]{1,18}")
_HEX = re.compile(rb"[0-9A-Fa-f]{1,15}")

Headers = tuple[tuple[bytes, bytes], ...]


class Unrelayable(ValueError):
    """A head the byte relay does not take (the full server answers it, or refuses it)."""


class BadFraming(ValueError):
    """A body whose framing breaks off: the connection cannot go on."""


class Framing(Enum):
    NONE = "none"
    LENGTH = "length"
    CHUNKED = "chunked"
    CLOSE = "close"  # an answer that ends when its sender closes


@dataclass(frozen=True, slots=True)
class RequestHead:
    method: bytes
    target: bytes  # path and query, as sent
    headers: Headers  # names lower-cased, in order
    framing: Framing
    length: int
    keep_alive: bool

    def header(self, name: bytes) -> bytes | None:
        return next((v for k, v in self.headers if k == name), None)


@dataclass(frozen=True, slots=True)
class ResponseHead:
    status: int
    reason: bytes
    headers: Headers
    framing: Framing
    length: int
    keep_alive: bool  # whether the sender's connection may carry another request


def head_end(buffer: bytes | bytearray) -> int | None:
    """Where the head at the start of ``buffer`` ends (past its blank line); None while it is not
    all there. A head longer than :data:`MAX_HEAD` is :class:`Unrelayable`."""
    end = buffer.find(b"\r\n\r\n", 0, MAX_HEAD + 4)
    if end < 0:
        if len(buffer) > MAX_HEAD:
            raise Unrelayable("head too long")
        return None
    return end + 4


def _fields(lines: list[bytes]) -> Headers:
    out = []
    for line in lines:
        name, colon, value = line.partition(b":")
        # No space before the colon, no folded lines, no control characters: one reading only.
        if not colon or not _TOKEN.fullmatch(name) or not _VALUE.fullmatch(value):
            raise Unrelayable("a header line that is not name: value")
        out.append((name.lower(), value.strip(b" \t")))
    return tuple(out)


def _connection(headers: Headers) -> set[bytes]:
    return {t.strip().lower() for k, v in headers if k == b"connection" for t in v.split(b",")}


def _length(headers: Headers) -> int | None:
    values = [v for k, v in headers if k == b"content-length"]
    if not values:
        return None
    if len(set(values)) != 1 or not _DIGITS.fullmatch(values[0]):
        raise Unrelayable("a Content-Length that is not one number")
    return int(values[0])


def parse_request(head: bytes) -> RequestHead:
    """A request head (with its blank line), or :class:`Unrelayable`."""
    lines = head[:-4].split(b"\r\n")
    parts = lines[0].split(b" ")
    if len(parts) != 3 or not _TOKEN.fullmatch(parts[0]) or not _TARGET.fullmatch(parts[1]):
        raise Unrelayable("not an origin-form request line")
    if parts[2] != b"HTTP/1.1":
        raise Unrelayable("not HTTP/1.1")
    headers = _fields(lines[1:])
    names = [k for k, _ in headers]
    connection = _connection(headers)
    if names.count(b"host") != 1 or b"upgrade" in names or b"expect" in names or b"upgrade" in connection:
        raise Unrelayable("no single Host, or an upgrade or expectation")
    length = _length(headers)
    codings = [v for k, v in headers if k == b"transfer-encoding"]
    if codings:
        if length is not None or len(codings) != 1 or codings[0].lower() != b"chunked":
            raise Unrelayable("a body framed other than by one chunked coding")
        framing, length = Framing.CHUNKED, 0
    elif length:
        framing = Framing.LENGTH
    else:
        framing, length = Framing.NONE, 0
    return RequestHead(parts[0], parts[1], headers, framing, length, b"close" not in connection)


def parse_response(head: bytes, method: bytes) -> ResponseHead:
    """An answer's head to a ``method`` request; :class:`BadFraming` when it is not one."""
    lines = head[:-4].split(b"\r\n")
    status = _STATUS.fullmatch(lines[0])
    if status is None:
        raise BadFraming("not an HTTP/1.x status line")
    code = int(status.group(2))
    try:
        headers = _fields(lines[1:])
        length = _length(headers)
    except Unrelayable as exc:
        raise BadFraming(str(exc)) from None
    codings = b",".join(v for k, v in headers if k == b"transfer-encoding")
    keep_alive = status.group(1) == b"1" and b"close" not in _connection(headers)
    if method == b"HEAD" or code < 200 or code in (204, 304):
        framing, length = Framing.NONE, 0
    elif codings:
        chunked = codings.rsplit(b",", 1)[-1].strip().lower() == b"chunked"
        framing, length = (Framing.CHUNKED, 0) if chunked else (Framing.CLOSE, 0)
    elif length is not None:
        framing = Framing.LENGTH if length else Framing.NONE
    else:
        framing, length = Framing.CLOSE, 0
    if framing is Framing.CLOSE:
        keep_alive = False
    return ResponseHead(code, status.group(3) or b"", headers, framing, length or 0, keep_alive)


def render_request(method: bytes, target: bytes, headers: Headers) -> bytes:
    return b"%s %s HTTP/1.1\r\n%s\r\n" % (method, target, b"".join(b"%s: %s\r\n" % kv for kv in headers))


def render_response(head: ResponseHead, closing: bool) -> bytes:
    """The answer's head as the caller gets it: what concerns the upstream hop left out, the framing
    kept (and only it: no length beside chunks, which a caller could read the other way);
    ``Connection: close`` when the caller's connection ends with it."""
    drop = SPLICE_DROPS | _connection(head.headers)
    if any(k == b"transfer-encoding" for k, _ in head.headers):  # a length beside it frames nothing
        drop |= {b"content-length"}
    kept = [(k, v) for k, v in head.headers if k not in drop or k == b"transfer-encoding"]
    if closing:
        kept.append((b"connection", b"close"))
    lines = b"".join(b"%s: %s\r\n" % kv for kv in kept)
    return b"HTTP/1.1 %d %s\r\n%s\r\n" % (head.status, head.reason, lines)


class _Chunk(Enum):
    SIZE = 0
    DATA = 1
    DATA_END = 2
    TRAILER = 3


class Body:
    """Where one body ends in the bytes that follow its head, fed as they come."""

    def __init__(self, framing: Framing, length: int = 0) -> None:
        self.framing = framing
        self.left = length if framing is Framing.LENGTH else 0
        self.done = framing is Framing.NONE
        self._state = _Chunk.SIZE
        self._line = bytearray()

    def feed(self, data: bytes | bytearray | memoryview) -> int:
        """How many of ``data``'s bytes are this body's (the rest is what follows it)."""
        if self.done:
            return 0
        if self.framing is Framing.CLOSE:
            return len(data)
        if self.framing is Framing.LENGTH:
            took = min(self.left, len(data))
            self.left -= took
            self.done = self.left == 0
            return took
        return self._chunks(memoryview(data))

    def _chunks(self, data: memoryview) -> int:
        at = 0
        while at < len(data) and not self.done:
            if self._state is _Chunk.DATA:
                took = min(self.left, len(data) - at)
                self.left -= took
                at += took
                if self.left == 0:
                    self._state = _Chunk.DATA_END
                continue
            end = bytes(data[at : at + MAX_TRAILER]).find(b"\n")
            if end < 0:
                self._line += data[at:]
                self._bound()
                return len(data)
            self._line += data[at : at + end + 1]
            at += end + 1
            self._bound()
            line = bytes(self._line)
            self._line.clear()
            self._line_done(line)
        return at

    def _bound(self) -> None:
        limit = MAX_TRAILER if self._state is _Chunk.TRAILER else MAX_CHUNK_LINE
        if len(self._line) > limit:
            raise BadFraming("a chunk line too long")

    def _line_done(self, line: bytes) -> None:
        if not line.endswith(b"\r\n"):
            raise BadFraming("a chunk line not ended by CRLF")
        line = line[:-2]
        if self._state is _Chunk.DATA_END:
            if line:
                raise BadFraming("a chunk longer than its size")
            self._state = _Chunk.SIZE
        elif self._state is _Chunk.SIZE:
            size = line.split(b";", 1)[0].strip(b" \t")
            if not _HEX.fullmatch(size):
                raise BadFraming("a chunk size that is not hexadecimal")
            self.left = int(size, 16)
            self._state = _Chunk.DATA if self.left else _Chunk.TRAILER
        elif not line:  # the blank line after the trailers
            self.done = True
