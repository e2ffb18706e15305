"""One request to a sandbox's port, relayed from an ASGI connection to an upstream HTTP server (the
sandbox's own, at its slot's address; or the agent of its host, which relays it there), as it comes:

* HTTP/1.1 both ways as a stream: the request body is read from the caller only as fast as the
  upstream takes it, and the answer sent on only as fast as the caller reads it (ASGI's ``send`` and
  ``receive`` wait on the sockets' buffers), so a 100 MB body costs a chunk of memory, not 100 MB;
  upstream connections are kept alive and reused;
* WebSocket upgrades: accepted here once the upstream accepted, then every message relayed each way
  until either side closes (its close code passed on);
* a refused connection (nothing listens on the port) answers 502 ``port_closed``.

Shared by a replica (relaying to a sandbox of its own process's agents, or to a remote agent) and an
agent (relaying to its sandbox), so both hops behave alike.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable, Collection, Mapping, Sequence
from typing import Any

import httpx
from starlette.types import Receive, Scope, Send
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus, WebSocketException

from corral.codes import ErrorCode
from corral.core.httphead import HOP_BY_HOP

_WS_OWN = frozenset(
    {b"host", b"sec-websocket-key", b"sec-websocket-version", b"sec-websocket-extensions"}
    | {b"sec-websocket-protocol"}
)
WS_MAX_MESSAGE = 16 * 1024 * 1024  # uvicorn's own bound on a message it accepts
CONNECT_TIMEOUT_S = 5.0
# A WebSocket's closing handshake with the sandbox's server, once a side has closed: a server that
# never finishes it (or never closes its TCP end) holds the relay, and a stopping server, this long.
WS_CLOSE_TIMEOUT_S = 1.0

Headers = list[tuple[bytes, bytes]]
# What a relay answers when the upstream cannot be reached: (status, code, message).
Unreachable = Callable[[BaseException], tuple[int, str, str]]


def port_closed(exc: BaseException) -> tuple[int, str, str]:
    return 502, ErrorCode.PORT_CLOSED, f"nothing answers on that port in the sandbox ({type(exc).__name__})"


def error_body(code: str, message: str, details: Mapping[str, Any] | None = None) -> bytes:
    body: dict[str, Any] = {"code": code, "message": message, "retry_after_s": None}
    body["details"] = dict(details or {})
    return json.dumps({"error": body}).encode()


async def refuse(
    scope: Scope,
    send: Send,
    status: int,
    code: str,
    message: str,
    headers: Mapping[str, str] | None = None,
    details: Mapping[str, Any] | None = None,
) -> None:
    """Answer ``status`` with corral's error body; for a WebSocket not yet accepted, as an HTTP
    answer where the server can give one (ASGI's ``websocket.http.response``), else a close."""
    data = error_body(code, message, details)
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
    raw += [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    if scope["type"] == "websocket":
        if "websocket.http.response" in scope.get("extensions", {}):
            await send({"type": "websocket.http.response.start", "status": status, "headers": raw})
            await send({"type": "websocket.http.response.body", "body": data})
        else:
            await send({"type": "websocket.close", "code": 1008 if status < 500 else 1011})
        return
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": data})


def _header(headers: Sequence[tuple[bytes, bytes]], name: bytes) -> bytes | None:
    return next((v for k, v in headers if k.lower() == name), None)


def raw_path(scope: Scope) -> str:
    """The request's path as the caller sent it (percent-escapes kept), without its query."""
    raw = scope.get("raw_path")
    return raw.decode("latin-1").split("?", 1)[0] if raw else str(scope["path"])


def request_headers(scope: Scope, drop: frozenset[bytes] = frozenset()) -> Headers:
    """The caller's headers as the next hop gets them: hop-by-hop ones and ``drop`` left out."""
    return [(k, v) for k, v in scope["headers"] if (key := k.lower()) not in HOP_BY_HOP and key not in drop]


class PortRelay:
    """The upstream side of relayed requests: one pool of kept-alive connections."""

    def __init__(self, transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.http = httpx.AsyncClient(
            transport=transport,
            timeout=httpx.Timeout(CONNECT_TIMEOUT_S, read=None, write=None, pool=None),
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=512, keepalive_expiry=30),
            trust_env=False,
            follow_redirects=False,
        )

    async def aclose(self) -> None:
        await self.http.aclose()

    async def __call__(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        url: str,
        headers: Headers,
        unreachable: Unreachable = port_closed,
    ) -> None:
        """Relay the caller's request (``scope``) to ``url`` (scheme, address and the whole path,
        without the query: the caller's is appended) with ``headers``."""
        query = scope.get("query_string", b"")
        if query:
            url += "?" + query.decode("latin-1")
        if scope["type"] == "websocket":
            await self._websocket(scope, receive, send, url, headers, unreachable)
        else:
            await self._http(scope, receive, send, url, headers, unreachable)

    # -- HTTP ----------------------------------------------------------------------------------------

    async def _http(
        self, scope: Scope, receive: Receive, send: Send, url: str, headers: Headers, unreachable: Unreachable
    ) -> None:
        framed = _header(scope["headers"], b"content-length") is not None
        chunked = b"chunked" in (_header(scope["headers"], b"transfer-encoding") or b"").lower()
        content: AsyncIterator[bytes] | bytes = request_body(receive) if framed or chunked else b""
        request = self.http.build_request(
            scope["method"],
            url,
            headers=[(k.decode("latin-1"), v.decode("latin-1")) for k, v in headers],
            content=content,
        )
        try:
            response = await self.http.send(request, stream=True)
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            status, code, message = unreachable(exc)
            await refuse(scope, send, status, code, message)
            return
        except httpx.HTTPError as exc:
            await refuse(
                scope, send, 502, ErrorCode.PORT_CLOSED, f"the upstream failed: {type(exc).__name__}"
            )
            return
        await relay_response(response, send)

    # -- WebSocket -----------------------------------------------------------------------------------

    async def _websocket(
        self, scope: Scope, receive: Receive, send: Send, url: str, headers: Headers, unreachable: Unreachable
    ) -> None:
        first = await receive()
        if first["type"] != "websocket.connect":
            return
        ws_url = "ws" + url.removeprefix("http")
        own = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in headers if k.lower() not in _WS_OWN]
        host = _header(scope["headers"], b"host")
        if host is not None and _header(headers, b"x-forwarded-host") is None:
            own.append(("x-forwarded-host", host.decode("latin-1")))
        try:
            upstream = await connect(
                ws_url,
                additional_headers=own,
                subprotocols=list(scope.get("subprotocols", [])) or None,
                open_timeout=CONNECT_TIMEOUT_S,
                close_timeout=WS_CLOSE_TIMEOUT_S,
                max_size=WS_MAX_MESSAGE,
                compression=None,
                user_agent_header=None,
                proxy=None,
            )
        except InvalidStatus as exc:
            # The upstream answered without upgrading: its answer (an agent's refusal among them).
            got = exc.response
            await _deny(scope, send, got.status_code, list(got.headers.raw_items()), bytes(got.body or b""))
            return
        except (OSError, TimeoutError, WebSocketException) as exc:
            status, code, message = unreachable(exc)
            await refuse(scope, send, status, code, message)
            return
        async with upstream:
            await send({"type": "websocket.accept", "subprotocol": upstream.subprotocol})
            await _pump(receive, send, upstream)


async def relay_response(
    response: httpx.Response, send: Send, hop_by_hop: Collection[bytes] = HOP_BY_HOP
) -> None:
    """Answer the caller with ``response`` (opened with ``stream=True``) as it comes, its
    ``hop_by_hop`` headers left out, and close it."""
    try:
        out = [(k, v) for k, v in response.headers.raw if k.lower() not in hop_by_hop]
        await send({"type": "http.response.start", "status": response.status_code, "headers": out})
        # An upstream that breaks off mid-answer raises here: the caller's connection is closed
        # too, so a cut answer never reads as a whole one.
        async for chunk in response.aiter_raw():
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b""})
    finally:
        await response.aclose()


async def request_body(receive: Receive) -> AsyncIterator[bytes]:
    """The caller's request body, chunk by chunk as it comes (until it is whole or the caller goes)."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
        if message.get("body"):
            yield message["body"]
        if not message.get("more_body"):
            return


async def _deny(scope: Scope, send: Send, status: int, headers: list[tuple[str, str]], body: bytes) -> None:
    if "websocket.http.response" not in scope.get("extensions", {}):
        await send({"type": "websocket.close", "code": 1008 if status < 500 else 1011})
        return
    keep = [
        (k.lower().encode(), v.encode()) for k, v in headers if k.lower() in ("content-type", "retry-after")
    ]
    keep.append((b"content-length", str(len(body)).encode()))
    await send({"type": "websocket.http.response.start", "status": status, "headers": keep})
    await send({"type": "websocket.http.response.body", "body": body})


async def _pump(receive: Receive, send: Send, upstream: ClientConnection) -> None:
    """Messages both ways until one side closes; the other is closed with its code."""

    async def from_caller() -> None:
        while True:
            message = await receive()
            if message["type"] == "websocket.disconnect":
                await upstream.close(message.get("code", 1000))
                return
            if message.get("text") is not None:
                await upstream.send(message["text"])
            elif message.get("bytes") is not None:
                await upstream.send(message["bytes"])

    async def to_caller() -> None:
        try:
            async for data in upstream:
                kind = "text" if isinstance(data, str) else "bytes"
                await send({"type": "websocket.send", kind: data})
        except ConnectionClosed:
            pass
        code = upstream.close_code or 1000
        with contextlib.suppress(Exception):  # the caller may be gone already
            await send({"type": "websocket.close", "code": code, "reason": upstream.close_reason or ""})

    tasks = [asyncio.ensure_future(from_caller()), asyncio.ensure_future(to_caller())]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, ConnectionClosed, OSError):
                await task
