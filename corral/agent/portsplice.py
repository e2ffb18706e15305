"""Sandboxes' port traffic spliced as bytes: a :class:`~corral.listener.Front` before a server's
HTTP parser (a replica's, and an agent's for what replicas forward to it). A request head is read
and judged whole (:mod:`corral.core.httphead`: a plain HTTP/1.1 request, framed one way), then
routed and authorised by the server's ``plan`` (:meth:`corral.api.ports.Ports.splice_plan`,
:meth:`corral.agent.ports.AgentPorts.splice_plan`: the same rules as their ASGI paths); a request it
takes goes on as its head re-written and its body's bytes as they came, and the answer comes back as
its head re-written and its body's bytes, over a kept-alive upstream connection; then the next
request of the connection is read the same way. No ASGI request is built, and neither httpx's nor
uvicorn's per-request work is done: a proxied request costs little more than the bytes.

Everything else (not a port request, a refusal, a WebSocket, an odd head) goes to uvicorn with the
bytes held so far, and the connection stays uvicorn's: the ASGI path is the one source of refusals
and of the rest of the API.

Flow control both ways: the caller is read only while the upstream takes its bytes (between a
request's end and its answer's, a pipelined request is held up to a head's worth), the upstream only
while the caller takes the answer. An upstream that breaks off mid-answer closes the caller's
connection, so a cut answer never reads as a whole one; one that fails before answering is a 502
``port_closed``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from enum import Enum
from typing import cast

from corral.agent.portrelay import CONNECT_TIMEOUT_S, error_body
from corral.codes import ErrorCode
from corral.core.httphead import (
    MAX_HEAD,
    BadFraming,
    Body,
    Framing,
    RequestHead,
    ResponseHead,
    Unrelayable,
    head_end,
    parse_request,
    parse_response,
    render_response,
)
from corral.listener import FrontConnection, Fronted

log = logging.getLogger("corral.agent.portsplice")

IDLE_PER_UPSTREAM = 32  # kept-alive connections kept per upstream address
# How long one is kept unused: a sandbox that is gone never closes its end (its namespace goes), so an
# idle connection would otherwise hold a descriptor for good.
IDLE_S = 30.0


@dataclass(frozen=True, slots=True)
class Splice:
    """Where a taken request goes: ``host``:``port``, ``head`` the request head it gets; ``release``
    once it is answered (or given up)."""

    host: str
    port: int
    head: bytes
    release: Callable[[], None]


Plan = Callable[[RequestHead], Awaitable[Splice | None]]


class _Upstream(asyncio.Protocol):
    """One connection to an upstream server; its bytes go to the relay that holds it."""

    def __init__(self, pool: UpstreamPool, key: tuple[str, int]) -> None:
        self.pool, self.key = pool, key
        self.transport: asyncio.Transport | None = None
        self.owner: _Connection | None = None
        self.closed = False
        self.expiry: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is one without the base class

    def data_received(self, data: bytes) -> None:
        if self.owner is not None:
            self.owner.upstream_data(self, data)
        else:  # bytes nobody asked for: the connection cannot be trusted with the next request
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.pool.discard(self)
        if self.owner is not None:
            self.owner.upstream_lost(self)

    def pause_writing(self) -> None:
        if self.owner is not None:
            self.owner.upstream_writable(self, False)

    def resume_writing(self) -> None:
        if self.owner is not None:
            self.owner.upstream_writable(self, True)

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self.transport is not None and not self.closed:
            self.transport.write(data)

    def close(self) -> None:
        self.owner = None
        if self.expiry is not None:
            self.expiry.cancel()
            self.expiry = None
        if self.transport is not None:
            self.transport.close()


class UpstreamPool:
    """Kept-alive upstream connections by address, taken one request at a time."""

    def __init__(self, idle_s: float = IDLE_S) -> None:
        self.idle_s = idle_s
        self.idle: dict[tuple[str, int], list[_Upstream]] = {}

    async def take(self, host: str, port: int) -> _Upstream:
        key = (host, port)
        kept = self.idle.get(key, [])
        while kept:
            upstream = kept.pop()
            if not kept:  # an address a caller named once keeps nothing here
                del self.idle[key]
            if upstream.expiry is not None:
                upstream.expiry.cancel()
                upstream.expiry = None
            if not upstream.closed and upstream.transport is not None and not upstream.transport.is_closing():
                return upstream
        loop = asyncio.get_running_loop()
        _, made = await asyncio.wait_for(
            loop.create_connection(lambda: _Upstream(self, key), host, port), CONNECT_TIMEOUT_S
        )
        return made

    def give_back(self, upstream: _Upstream) -> None:
        upstream.owner = None
        if upstream.transport is not None and not upstream.closed:
            upstream.transport.resume_reading()  # its last caller may have been slow to read
        kept = self.idle.get(upstream.key, [])
        if upstream.closed or len(kept) >= IDLE_PER_UPSTREAM:
            upstream.close()
            return
        self.idle[upstream.key] = kept
        upstream.expiry = asyncio.get_running_loop().call_later(self.idle_s, upstream.close)
        kept.append(upstream)

    def discard(self, upstream: _Upstream) -> None:
        kept = self.idle.get(upstream.key)
        if kept is not None and upstream in kept:
            kept.remove(upstream)
            if not kept:
                del self.idle[upstream.key]

    def close(self) -> None:
        for kept in list(self.idle.values()):
            for upstream in list(kept):
                upstream.close()
        self.idle.clear()


class PortSplicer:
    """The front: one :class:`_Connection` per client connection, one pool of upstreams."""

    def __init__(self, plan: Plan, idle_s: float = IDLE_S) -> None:
        self.plan = plan
        self.pool = UpstreamPool(idle_s)

    def connection(self, server: Fronted) -> FrontConnection:
        return _Connection(self, server)


class _Phase(Enum):
    IDLE = 0  # reading a request head
    DECIDING = 1  # a head read, its route being found
    RELAYING = 2
    GONE = 3  # handed over to uvicorn, or closed


def failure_response(status: int, reason: bytes, code: str, message: str) -> bytes:
    body = error_body(code, message)
    head = b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n" % (
        status,
        reason,
        len(body),
    )
    return head + b"connection: close\r\n\r\n" + body


class _Connection:
    """One client connection while the front holds it."""

    def __init__(self, splicer: PortSplicer, server: Fronted) -> None:
        self.splicer, self.server = splicer, server
        self.transport = server.transport
        self.buffer = bytearray()
        self.phase = _Phase.IDLE
        self.stopping = False
        self.upstream_full = False
        self.idle_timer: asyncio.TimerHandle | None = None
        self.request: RequestHead | None = None
        self.request_body = Body(Framing.NONE)
        self.upstream: _Upstream | None = None
        self.splice: Splice | None = None
        self.response: ResponseHead | None = None
        self.response_head = bytearray()
        self.response_body = Body(Framing.NONE)
        self.closing = False
        self.task: asyncio.Task[None] | None = None

    # -- the caller's side ---------------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        self._unidle()
        if self.phase is _Phase.RELAYING and not self.request_body.done and not self.buffer:
            self._body_bytes(data)
        else:
            self.buffer += data
        if self.phase is _Phase.IDLE:
            self._next()
        elif self.phase is _Phase.RELAYING:
            self._pump_request()
        self._sync_reading()

    def writing_paused(self, paused: bool) -> None:
        if self.upstream is not None and self.upstream.transport is not None and not self.upstream.closed:
            if paused:
                self.upstream.transport.pause_reading()
            else:
                self.upstream.transport.resume_reading()

    def connection_lost(self) -> None:
        self.phase = _Phase.GONE
        self._unidle()
        self._end_relay(reuse=False)

    def shutdown(self) -> bool:
        if self.phase in (_Phase.DECIDING, _Phase.RELAYING):
            self.stopping = True
            return True
        return False

    def _next(self) -> None:
        """Read the next request head from the buffer (IDLE)."""
        if not self.buffer:
            self._arm_idle()
            return
        deadlines = self.server.deadlines
        if deadlines is not None:
            deadlines.expect_head()
        try:
            end = head_end(self.buffer)
            if end is None:
                return
            head = parse_request(bytes(self.buffer[:end]))
        except Unrelayable:
            self._hand_over()
            return
        if deadlines is not None:
            deadlines.head_done()
        self.phase = _Phase.DECIDING
        self.task = asyncio.get_running_loop().create_task(self._decide(head, end))
        self._sync_reading()

    async def _decide(self, head: RequestHead, end: int) -> None:
        try:
            splice = await self.splicer.plan(head)
        except Exception:  # the ASGI path answers it, in its own terms
            log.exception("routing a port request")
            splice = None
        upstream = None
        if splice is not None and self.phase is _Phase.DECIDING:
            try:
                upstream = await self.splicer.pool.take(splice.host, splice.port)
            except Exception:  # nothing listens, the host is down: the ASGI path answers why
                upstream = None
        if self.phase is not _Phase.DECIDING or upstream is None or splice is None:
            if splice is not None:
                splice.release()
            if upstream is not None:
                self.splicer.pool.give_back(upstream)
            if self.phase is _Phase.DECIDING:
                self._hand_over()
            return
        del self.buffer[:end]
        self.request, self.splice, self.upstream = head, splice, upstream
        self.request_body = Body(head.framing, head.length)
        self.response, self.closing = None, not head.keep_alive
        self.response_head.clear()
        upstream.owner = self
        # The caller's transport says "paused" once: an answer begun while it is full waits for it.
        self.writing_paused(self.server.flow.write_paused)
        self.phase = _Phase.RELAYING
        upstream.write(splice.head)
        self._pump_request()
        self._sync_reading()

    def _pump_request(self) -> None:
        if self.buffer and not self.request_body.done:
            data = bytes(self.buffer)
            self.buffer.clear()
            self._body_bytes(data)

    def _body_bytes(self, data: bytes) -> None:
        """The caller's bytes while its request body is due: the body's to the upstream, the rest
        (a pipelined request) held."""
        try:
            took = self.request_body.feed(data)
        except BadFraming:
            self._close_all()
            return
        if took:
            assert self.upstream is not None
            self.upstream.write(data[:took] if took < len(data) else data)
        if took < len(data):
            self.buffer += data[took:]
        deadlines = self.server.deadlines
        if deadlines is not None:
            if self.request_body.done:
                deadlines.body_done()
            else:
                deadlines.body_moved()

    # -- the upstream's side -------------------------------------------------------------------------

    def upstream_data(self, upstream: _Upstream, data: bytes) -> None:
        if upstream is not self.upstream or self.request is None:
            upstream.close()
            return
        try:
            if self.response is None:
                self.response_head += data
                data = self._answer_head()
                if self.response is None:
                    return
            took = self.response_body.feed(data)
        except (BadFraming, Unrelayable):
            self._upstream_failed()
            return
        if took:
            self.transport.write(data[:took] if took < len(data) else data)
        if took < len(data):  # bytes past the answer: never reused
            upstream.owner = None
            self.upstream = None
            upstream.close()
            self._answered(reuse=False)
            return
        if self.response_body.done:
            self._answered(reuse=True)

    def _answer_head(self) -> bytes:
        """Past interim (1xx) heads to the final one: sent on; the bytes after it."""
        assert self.request is not None
        while True:
            end = head_end(self.response_head)
            if end is None:
                return b""
            head = parse_response(bytes(self.response_head[:end]), self.request.method)
            rest = bytes(self.response_head[end:])
            del self.response_head[:]
            if head.status == 101:
                raise BadFraming("an upgrade nobody asked for")
            if head.status >= 200:
                self.response = head
                self.closing = self.closing or self.stopping or head.framing is Framing.CLOSE
                self.response_body = Body(head.framing, head.length)
                self.transport.write(render_response(head, self.closing))
                return rest
            self.transport.write(render_response(head, False))
            self.response_head += rest

    def upstream_lost(self, upstream: _Upstream) -> None:
        if upstream is not self.upstream:
            return
        self.upstream = None
        if self.response is not None and self.response.framing is Framing.CLOSE:
            self._answered(reuse=False)  # its end is its close
        else:
            self._upstream_failed()

    def upstream_writable(self, upstream: _Upstream, writable: bool) -> None:
        if upstream is self.upstream:
            self.upstream_full = not writable
            self._sync_reading()

    def _upstream_failed(self) -> None:
        if self.phase is not _Phase.RELAYING:
            return
        if self.response is None:
            message = "the sandbox's server closed the connection without an answer"
            self.transport.write(failure_response(502, b"Bad Gateway", ErrorCode.PORT_CLOSED, message))
        # Else cut mid-answer: the caller's connection closes with it, never reading as whole.
        self._close_all()

    # -- ends ----------------------------------------------------------------------------------------

    def _answered(self, reuse: bool) -> None:
        """The answer is whole: the upstream back to the pool (when it may carry another request),
        the caller's next request read."""
        reuse = reuse and self.request_body.done and self.response is not None and self.response.keep_alive
        if not self.request_body.done:
            self.closing = True  # the rest of the body cannot be told from a next request
        self._end_relay(reuse)
        if self.closing:
            self.phase = _Phase.GONE
            self.transport.close()
            return
        self.phase = _Phase.IDLE
        self._sync_reading()
        self._next()

    def _end_relay(self, reuse: bool) -> None:
        upstream, self.upstream = self.upstream, None
        if upstream is not None:
            if reuse:
                self.splicer.pool.give_back(upstream)
            else:
                upstream.close()
        splice, self.splice = self.splice, None
        if splice is not None:
            splice.release()
        self.request, self.response, self.upstream_full = None, None, False

    def _close_all(self) -> None:
        self._end_relay(reuse=False)
        self.phase = _Phase.GONE
        self.transport.close()

    def _hand_over(self) -> None:
        self.phase = _Phase.GONE
        self._unidle()
        self.server.flow.resume_reading()
        data = bytes(self.buffer)
        self.buffer.clear()
        self.server.hand_over(data)
        if self.stopping:  # the stop came to the front: uvicorn's protocol ends with this request
            self.server.shutdown()

    # -- reading and idling ----------------------------------------------------------------------------

    def _sync_reading(self) -> None:
        """Read the caller only while its bytes have somewhere to go: to the upstream, or a head's
        worth held (a pipelined request; pausing for every request would cost two system calls)."""
        if self.phase is _Phase.GONE:
            return
        holding = self.phase is _Phase.DECIDING or (self.phase is _Phase.RELAYING and self.request_body.done)
        pause = (holding and len(self.buffer) > MAX_HEAD) or (
            self.phase is _Phase.RELAYING and self.upstream_full
        )
        if self.transport.is_closing():
            return
        if pause:
            self.server.flow.pause_reading()
        else:
            self.server.flow.resume_reading()

    def _arm_idle(self) -> None:
        deadlines = self.server.deadlines
        if self.stopping:
            self.phase = _Phase.GONE
            self.transport.close()
        elif deadlines is not None and self.idle_timer is None:
            self.idle_timer = self.server.loop.call_later(deadlines.bounds.keep_alive_s, self._idle_out)

    def _unidle(self) -> None:
        if self.idle_timer is not None:
            self.idle_timer.cancel()
            self.idle_timer = None

    def _idle_out(self) -> None:
        self.idle_timer = None
        if self.phase is _Phase.IDLE and not self.buffer:
            with contextlib.suppress(Exception):
                self.transport.close()
