"""Request bodies are capped per route, while they are read: a pure ASGI layer in front of the app.

A declared ``Content-Length`` over the cap is refused before a byte of the body is read; a body sent
without one (chunked) is cut off as soon as it passes the cap, and the app's answer to the truncated
body is replaced by the 413. Either way a 10 MB body costs at most the cap in memory. On the hot path
this is one header lookup and a counter.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from corral.api.errors import error_response
from corral.control.errors import PayloadTooLarge

MIB = 1024 * 1024
DEFAULT_BODY_BYTES = MIB
# A heartbeat lists every sandbox on its host (10,000 and more, ids up to 128 characters).
BODY_BYTES: Mapping[str, int] = {"/v1/agent/heartbeat": 4 * MIB}


class BodyLimit:
    def __init__(
        self,
        app: ASGIApp,
        default: int = DEFAULT_BODY_BYTES,
        per_path: Mapping[str, int] = BODY_BYTES,
        uploads: Callable[[str, str], int | None] | None = None,
    ) -> None:
        """``uploads``: the cap of a route that takes an archive (by path and method; None for the others)."""
        self.app = app
        self.default = default
        self.per_path = dict(per_path)
        self.uploads = uploads

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        upload = self.uploads(scope["path"], scope["method"]) if self.uploads is not None else None
        cap = upload if upload is not None else self.per_path.get(scope["path"], self.default)
        declared = _content_length(scope)
        if declared is not None and declared > cap:
            await _refuse(cap, scope, receive, send)
            return
        seen = 0
        over = False
        started = False

        async def capped_receive() -> Message:
            nonlocal seen, over
            if over:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > cap:
                    # The app gets an empty end of body; its answer is replaced below.
                    over = True
                    return {"type": "http.request", "body": b"", "more_body": False}
            return message

        async def guarded_send(message: Message) -> None:
            nonlocal started
            if over and not started:
                return
            started = True
            await send(message)

        await self.app(scope, capped_receive, guarded_send)
        if over and not started:
            await _refuse(cap, scope, receive, send)


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


async def _refuse(cap: int, scope: Scope, receive: Receive, send: Send) -> None:
    err = PayloadTooLarge(f"the request body is over this route's {cap} bytes", details={"max_bytes": cap})
    response = error_response(err.status, err.code, err.message, details=err.details)
    # The rest of the body is never read: the connection closes after this answer.
    response.headers["Connection"] = "close"
    await response(scope, receive, send)
