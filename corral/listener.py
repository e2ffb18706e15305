"""uvicorn under corral's :class:`~corral.core.listen.ListenBounds`: every listening server (the API,
the host agent) is configured here.

uvicorn has no header-read timeout of its own: its keep-alive timer runs only between requests, so a
client sending a header line every few seconds held a connection (and a descriptor) for as long as
it liked. The protocols below are uvicorn's own (httptools, or h11 where httptools is absent, as
uvicorn's "auto" chooses), each with a deadline for the request head, one for every silence inside
a body, and a cap on open connections applied as they are accepted.

A server may put a :class:`Front` before uvicorn's parser: it sees each connection's bytes first and
answers the requests it takes itself (a replica splices sandboxes' port traffic: no ASGI request is
built), until it hands the connection, with the bytes it holds, to uvicorn for good.
"""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import resource
from collections import Counter
from collections.abc import Callable
from typing import Any, ClassVar, Protocol

import h11
import uvicorn
from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.h11_impl import H11Protocol

from corral.core.listen import ListenBounds, connection_cap

log = logging.getLogger("corral.listener")

# The key, in every request's ``scope["state"]``, of its connection's client certificate: present only
# when the TLS layer asked for one (a client CA: ``ssl_ca_certs``, ``CERT_OPTIONAL``) and verified it,
# as ``ssl.SSLSocket.getpeercert()`` gives it. Set by the server, never from anything a client sends.
TLS_PEER = "corral.tls_peer"


class Gate:
    """One server's connections: the cap on open ones (total and per peer address)."""

    def __init__(self, bounds: ListenBounds, open_files: int | None) -> None:
        self.bounds = bounds
        self.cap = connection_cap(bounds.max_connections, open_files)
        self.per_peer: Counter[str] = Counter()

    def admit(self, open_now: int, peer: str | None) -> bool:
        per_peer = self.bounds.max_connections_per_peer
        if open_now > self.cap or (
            per_peer is not None and peer is not None and self.per_peer[peer] >= per_peer
        ):
            return False
        if peer is not None:
            self.per_peer[peer] += 1
        return True

    def release(self, peer: str | None) -> None:
        if peer is not None:
            self.per_peer[peer] -= 1
            if self.per_peer[peer] <= 0:
                del self.per_peer[peer]


class ConnectionDeadlines:
    """One connection's timers: its request head, and the silence inside a body."""

    def __init__(
        self,
        bounds: ListenBounds,
        loop: asyncio.AbstractEventLoop,
        transport: asyncio.BaseTransport,
        reading_paused: Callable[[], bool],
    ) -> None:
        self.bounds = bounds
        self.loop = loop
        self.transport = transport
        # The server stopped reading (the app has not taken the body so far): a stall of its own.
        self.reading_paused = reading_paused
        self._head: asyncio.TimerHandle | None = None
        self._body: asyncio.TimerHandle | None = None

    def expect_head(self) -> None:
        """A head is due (the connection opened, or a request's first byte came): the earlier
        deadline holds."""
        if self._head is None:
            self._head = self.loop.call_later(self.bounds.header_timeout_s, self._head_late)

    def head_done(self) -> None:
        if self._head is not None:
            self._head.cancel()
            self._head = None

    def body_moved(self) -> None:
        self.body_done()
        self._body = self.loop.call_later(self.bounds.body_timeout_s, self._body_late)

    def body_done(self) -> None:
        if self._body is not None:
            self._body.cancel()
            self._body = None

    def stop(self) -> None:
        self.head_done()
        self.body_done()

    def _head_late(self) -> None:
        self._head = None
        self._close("request head")

    def _body_late(self) -> None:
        self._body = None
        if self.reading_paused():
            self.body_moved()
        else:
            self._close("request body")

    def _close(self, what: str) -> None:
        if not self.transport.is_closing():
            log.debug("closing a connection: its %s is late", what)
            self.transport.close()


class _Bounded:
    """What the two protocols share: admission at accept, release at close. It comes first in each
    protocol's bases, so its ``connection_made`` and ``connection_lost`` wrap uvicorn's."""

    gate: ClassVar[Gate]
    deadlines: ConnectionDeadlines | None = None
    _peer: str | None = None
    # uvicorn's, on both protocols: each request's scope["state"] is a copy of app_state.
    app_state: dict[str, Any]
    connections: set[Any]
    loop: asyncio.AbstractEventLoop
    flow: FlowControl

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)  # type: ignore[misc]
        peername = transport.get_extra_info("peername")
        peer = str(peername[0]) if isinstance(peername, tuple) and peername else None
        if not self.gate.admit(len(self.connections), peer):
            log.debug("refusing a connection from %s: at the connection bound", peer)
            transport.close()
            return
        self._peer = peer
        self.deadlines = ConnectionDeadlines(
            self.gate.bounds, self.loop, transport, lambda: self.flow.read_paused
        )
        self.deadlines.expect_head()
        # uvicorn puts no TLS details in the scope: the connection's own copy of the state carries them.
        tls = transport.get_extra_info("ssl_object")
        certificate = tls.getpeercert() if tls is not None else None
        if certificate:
            self.app_state = {**self.app_state, TLS_PEER: certificate}

    def connection_lost(self, exc: Exception | None) -> None:
        if self.deadlines is not None:
            self.deadlines.stop()
            self.deadlines = None
            self.gate.release(self._peer)
        super().connection_lost(exc)  # type: ignore[misc]


class _BoundedH11(_Bounded, H11Protocol):
    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._follow()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._follow()

    def _follow(self) -> None:
        # h11 says where the client is in its request: waiting for one (with part of a head buffered or
        # not), sending a body, or done.
        d = self.deadlines
        if d is None:
            return
        state = self.conn.their_state
        if state is h11.IDLE:
            if self.conn.trailing_data[0]:
                d.expect_head()
        elif state is h11.SEND_BODY:
            d.head_done()
            d.body_moved()
        else:
            d.stop()


def _httptools_class() -> type[_Bounded] | None:
    if importlib.util.find_spec("httptools") is None:
        return None
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    class _BoundedHttpTools(_Bounded, HttpToolsProtocol):
        # The parser's callbacks (httptools binds them when the protocol makes its parser).
        def on_message_begin(self) -> None:
            super().on_message_begin()
            if self.deadlines is not None:
                self.deadlines.expect_head()

        def on_headers_complete(self) -> None:
            if self.deadlines is not None:
                self.deadlines.head_done()
                self.deadlines.body_moved()
            super().on_headers_complete()

        def on_body(self, body: bytes) -> None:
            super().on_body(body)
            if self.deadlines is not None:
                self.deadlines.body_moved()

        def on_message_complete(self) -> None:
            super().on_message_complete()
            if self.deadlines is not None:
                self.deadlines.body_done()

    return _BoundedHttpTools


class FrontConnection(Protocol):
    """One connection's bytes, while a :class:`Front` holds it."""

    def data_received(self, data: bytes) -> None: ...

    def writing_paused(self, paused: bool) -> None: ...

    def connection_lost(self) -> None: ...

    def shutdown(self) -> bool:
        """The server stops: True when the connection closes itself once its request is answered."""
        ...


class Fronted(Protocol):
    """What a front gets of the server's side of a connection."""

    transport: asyncio.Transport
    loop: asyncio.AbstractEventLoop
    deadlines: ConnectionDeadlines | None
    flow: FlowControl  # reading paused through it, so the body deadline sees a pause as the server's

    def hand_over(self, data: bytes) -> None:
        """The connection is uvicorn's from here on, ``data`` the first of its bytes."""
        ...

    def shutdown(self) -> None:
        """The server stops (uvicorn's own, once the connection is handed over)."""
        ...


class Front(Protocol):
    def connection(self, server: Fronted) -> FrontConnection: ...


class _FrontMixin:
    """Before uvicorn's protocol (mixed in first): the front's while it holds the connection."""

    front: ClassVar[Front]
    fronted: FrontConnection | None = None
    deadlines: ConnectionDeadlines | None

    def connection_made(self, transport: asyncio.Transport) -> None:
        super().connection_made(transport)  # type: ignore[misc]
        if self.deadlines is not None:  # admitted
            self.fronted = self.front.connection(self)  # type: ignore[arg-type]

    def data_received(self, data: bytes) -> None:
        if self.fronted is not None:
            self.fronted.data_received(data)
        else:
            super().data_received(data)  # type: ignore[misc]

    def hand_over(self, data: bytes) -> None:
        self.fronted = None
        if data:
            super().data_received(data)  # type: ignore[misc]

    def pause_writing(self) -> None:
        super().pause_writing()  # type: ignore[misc]
        if self.fronted is not None:
            self.fronted.writing_paused(True)

    def resume_writing(self) -> None:
        super().resume_writing()  # type: ignore[misc]
        if self.fronted is not None:
            self.fronted.writing_paused(False)

    def connection_lost(self, exc: Exception | None) -> None:
        fronted, self.fronted = self.fronted, None
        if fronted is not None:
            fronted.connection_lost()
        super().connection_lost(exc)  # type: ignore[misc]

    def shutdown(self) -> None:
        if self.fronted is None or not self.fronted.shutdown():
            super().shutdown()  # type: ignore[misc]


IMPLEMENTATIONS = ("httptools", "h11")


def protocol_class(
    bounds: ListenBounds, implementation: str | None = None, front: Front | None = None
) -> type[asyncio.Protocol]:
    """A protocol class for one server (its own :class:`Gate`). ``implementation``: httptools or h11;
    None: httptools where it is installed, as uvicorn's "auto". ``front``: sees the bytes first."""
    base: type[_Bounded] = _BoundedH11
    if implementation in (None, "httptools"):
        tools = _httptools_class()
        if tools is None and implementation == "httptools":
            raise ValueError("httptools is not installed")
        base = tools or _BoundedH11
    elif implementation != "h11":
        raise ValueError(f"unknown HTTP implementation {implementation!r} (one of {IMPLEMENTATIONS})")
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    gate = Gate(bounds, soft)
    name = f"Bounded{base.__name__.removeprefix('_Bounded')}"
    if front is not None:
        return type(f"Fronted{name}", (_FrontMixin, base), {"gate": gate, "front": front})
    return type(name, (base,), {"gate": gate})


def uvicorn_config(
    app: Any,
    host: str,
    port: int,
    bounds: ListenBounds,
    *,
    implementation: str | None = None,
    front: Front | None = None,
    **kwargs: Any,
) -> uvicorn.Config:
    """The one way corral's servers configure uvicorn. ``kwargs``: uvicorn's own (log level, lifespan)."""
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        http=protocol_class(bounds, implementation, front),
        timeout_keep_alive=bounds.keep_alive_s,
        **kwargs,
    )
