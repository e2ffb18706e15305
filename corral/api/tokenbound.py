"""A bound on the requests one credential has in flight: a pure ASGI layer in front of the whole app.

A token is known only once a request's head is read, so this bounds requests, not connections (the
listener caps those as they are accepted). The credential is whichever the request presents: a bearer
token, an E2B API key or a sandbox's access token. It is kept only as a digest, never logged, and
checked by nobody here: a made-up token is bounded as one of its own, then refused by the app.
"""

from __future__ import annotations

import hashlib
from collections import Counter

from starlette.types import ASGIApp, Receive, Scope, Send

from corral.api.errors import error_response
from corral.codes import ErrorCode

CREDENTIAL_HEADERS = (b"authorization", b"x-api-key", b"x-access-token")
RETRY_AFTER_S = 1


def credential_key(scope: Scope) -> bytes | None:
    for name, value in scope.get("headers", ()):
        if name in CREDENTIAL_HEADERS and value:
            return hashlib.blake2b(name + b"\0" + value.strip(), digest_size=16).digest()
    return None


class TokenBound:
    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit
        self.in_flight: Counter[bytes] = Counter()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        key = credential_key(scope) if scope["type"] == "http" else None
        if key is None:
            await self.app(scope, receive, send)
            return
        if self.in_flight[key] >= self.limit:
            response = error_response(
                ErrorCode.TOO_MANY_CONNECTIONS.status or 429,
                ErrorCode.TOO_MANY_CONNECTIONS,
                f"this token already has {self.limit} requests in flight; retry when one ends",
                retry_after_s=RETRY_AFTER_S,
                details={"max_in_flight": self.limit},
            )
            await response(scope, receive, send)
            return
        self.in_flight[key] += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.in_flight[key] -= 1
            if self.in_flight[key] <= 0:
                del self.in_flight[key]
