"""One structured log line per request, with a request id the response carries back.

A caller's ``X-Request-Id`` is kept when it is sane (1-128 printable ASCII characters, no spaces), so a
client's id follows its request through the logs; otherwise one is generated. A plain ASGI middleware,
not Starlette's ``BaseHTTPMiddleware``: it adds no task and no copy of the body to the create path.
"""

from __future__ import annotations

import logging
import re
import time
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from corral.ids import random_hex
from corral.logs import begin_request, end_request

HEADER = "x-request-id"
_SANE = re.compile(rb"[!-~]{1,128}")

log = logging.getLogger("corral.request")


def request_id(scope: Scope) -> str:
    for name, value in scope.get("headers", ()):
        if name == b"x-request-id":
            if _SANE.fullmatch(value):
                return str(value.decode("ascii"))
            break
    return random_hex(64)


class RequestLog:
    def __init__(self, app: ASGIApp, replica: str = "") -> None:
        self.app = app
        self.replica = replica

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        rid = request_id(scope)
        raw_id = rid.encode("ascii")
        fields: dict[str, Any] = {
            "request_id": rid,
            "method": scope["method"],
            "path": scope["path"][:256],
        }
        if self.replica:
            fields["replica"] = self.replica
        status = 500

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message["headers"] = [*message.get("headers", ()), (b"x-request-id", raw_id)]
            await send(message)

        token = begin_request(fields)
        try:
            await self.app(scope, receive, send_with_id)
        finally:
            end_request(token)
            fields["status"] = status
            fields["ms"] = round((time.perf_counter() - started) * 1000, 2)
            if log.isEnabledFor(logging.INFO):
                log.info("request", extra={"fields": fields})
