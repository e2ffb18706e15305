"""Connect RPC's wire format with the JSON codec, as much of it as the data plane speaks.

Unary calls are ``POST /<package>.<Service>/<Method>`` with an ``application/json`` body and answer a
JSON message, or an error ``{"code", "message"}`` with the HTTP status of its code. Server streams
take and answer ``application/connect+json`` envelopes: one flags byte, a big-endian u32 length, the
JSON; the stream ends with an envelope flagged ``END_STREAM`` holding ``{}`` or ``{"error": ...}``.
"""

from __future__ import annotations

import asyncio
import json
import struct
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from corral.codes import retry_after_header

END_STREAM = 0x02
STREAM_CONTENT_TYPE = "application/connect+json"
UNARY_CONTENT_TYPE = "application/json"
_HEADER = struct.Struct(">BI")
T = TypeVar("T")
KEEPALIVE_DEFAULT_S = 50.0  # between keepalive events of a stream, unless the client asks otherwise

# Connect codes and the HTTP status a unary error answers with.
HTTP_STATUS = {
    "canceled": 499,
    "unknown": 500,
    "invalid_argument": 400,
    "deadline_exceeded": 504,
    "not_found": 404,
    "already_exists": 409,
    "permission_denied": 403,
    "resource_exhausted": 429,
    "failed_precondition": 400,
    "aborted": 409,
    "out_of_range": 400,
    "unimplemented": 501,
    "internal": 500,
    "unavailable": 503,
    "data_loss": 500,
    "unauthenticated": 401,
}


class RpcError(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code if code in HTTP_STATUS else "unknown"
        self.message = message

    @property
    def status(self) -> int:
        return HTTP_STATUS[self.code]

    def body(self) -> dict[str, str]:
        return {"code": self.code, "message": self.message}


class RpcBusy(RpcError):
    """Too many of the sandbox's commands in flight: ``resource_exhausted`` (429) with a Retry-After."""

    def __init__(self, message: str, retry_after_s: float | None) -> None:
        super().__init__("resource_exhausted", message)
        self.retry_after_s = retry_after_s

    def headers(self) -> dict[str, str]:
        return {"Retry-After": retry_after_header(self.retry_after_s)}


class JsonAnswer(JSONResponse):
    """A unary answer written as the streams' envelopes are: JSON in ASCII. A file name that is not
    UTF-8 (its bytes surrogate-escaped, as Python decodes names) travels as its ``\\udcXX`` escapes,
    which a client sends back to name the same file; UTF-8 could not carry it at all."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, allow_nan=False, separators=(",", ":")).encode()


def envelope(message: Any, flags: int = 0) -> bytes:
    data = json.dumps(message, separators=(",", ":")).encode()
    return _HEADER.pack(flags, len(data)) + data


def end_stream(error: RpcError | None = None) -> bytes:
    return envelope({"error": error.body()} if error else {}, END_STREAM)


def parse_json(data: bytes) -> dict[str, Any]:
    try:
        message = json.loads(data or b"{}")
    except ValueError:
        raise RpcError("invalid_argument", "the request is not JSON") from None
    if not isinstance(message, dict):
        raise RpcError("invalid_argument", "the request must be a JSON object")
    return message


def unwrap(body: bytes) -> dict[str, Any]:
    """The single request message of a server stream's enveloped body."""
    if len(body) < _HEADER.size:
        raise RpcError("invalid_argument", "the stream request holds no envelope")
    flags, length = _HEADER.unpack_from(body)
    if flags & 0x01:
        raise RpcError("unimplemented", "compressed messages are not accepted")
    if len(body) != _HEADER.size + length:
        raise RpcError("invalid_argument", "the stream request must hold exactly one message")
    return parse_json(body[_HEADER.size :])


class DetachingStream(StreamingResponse):
    """A server stream that lets go of what it follows (a command, a watch) however the response
    ends: a client gone while its stream was blocked leaves the generator suspended, its
    ``finally`` never run."""

    def __init__(self, content: AsyncIterator[bytes], detach: Callable[[], None]) -> None:
        super().__init__(content, media_type=STREAM_CONTENT_TYPE)
        self._detach = detach

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._detach()


def stream_deadline(header: str | None) -> float | None:
    """When a stream must end, from its ``connect-timeout-ms`` header (None: never)."""
    try:
        return time.monotonic() + int(header or "") / 1000.0
    except ValueError:
        return None


def keepalive_interval(header: str | None) -> float:
    """Seconds between a stream's keepalive events, from E2B's ``keepalive-ping-interval`` header."""
    try:
        return max(1.0, min(float(header or KEEPALIVE_DEFAULT_S), 300.0))
    except ValueError:
        return KEEPALIVE_DEFAULT_S


async def next_or_keepalive(get: Callable[[], Awaitable[T]], until: float | None, every: float) -> T | None:
    """The next item ``get`` gives, or None when ``every`` seconds pass without one (the stream's
    keepalive is due); ``deadline_exceeded`` once the stream's deadline ``until`` has passed."""
    wait = every if until is None else min(every, until - time.monotonic())
    if wait <= 0:
        raise RpcError("deadline_exceeded", "the stream's deadline passed")
    try:
        return await asyncio.wait_for(get(), wait)
    except TimeoutError:
        return None


def stream_error(exc: RpcError) -> Response:
    # A stream's errors travel in its end envelope, under HTTP 200.
    return Response(end_stream(exc), media_type=STREAM_CONTENT_TYPE)
