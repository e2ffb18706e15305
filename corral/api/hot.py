"""The hot routes (create, get and delete a sandbox) served by a plain ASGI layer, without FastAPI's
per-request dependency solving and response-model pass, which cost more than the rest of the request.

They keep what the declared routes promise: the body is validated by the same pydantic model, the
caller authenticated by the same rule, every failure answered in the same error shape, and the routes
stay declared in ``routes.py``, so /openapi.json describes them from the same models. The app sends
them here before its own middleware stack (only the request log and the body cap run first); every
other request goes through FastAPI untouched.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from corral.api.auth import authenticated_user, owner
from corral.api.auth import scope as tenant_scope
from corral.api.errors import invalid_request, response_for
from corral.api.jsonresponse import OrjsonResponse
from corral.api.schemas import SandboxSpecBody, sandbox_json
from corral.control.errors import ResourceNotFound
from corral.control.plane import ControlPlane
from corral.store import Principal, SandboxRecord

COLLECTION = "/v1/sandboxes"
_ONE = COLLECTION + "/"
IDEMPOTENCY_KEY_MAX = 256
DISCONNECT_POLL_S = 0.5


async def create(
    plane: ControlPlane, p: Principal, body: SandboxSpecBody, idempotency_key: str | None
) -> tuple[SandboxRecord, bool]:
    """A create as both entries to it run it: (record, replayed)."""
    record, replayed = await plane.creates.create(
        owner(p, plane), body.create_spec(), idempotency_key=idempotency_key
    )
    await plane.sandboxes.remember(record)
    return record, replayed


class _Invalid(Exception):
    def __init__(self, errors: list[dict[str, Any]]) -> None:
        self.errors = errors


def _body(raw: bytes) -> SandboxSpecBody:
    try:
        return SandboxSpecBody.model_validate_json(raw)
    except ValidationError as exc:
        raise _Invalid([{**e, "loc": ("body", *e["loc"])} for e in exc.errors()]) from None


def _idempotency_key(request: Request) -> str | None:
    key = request.headers.get("idempotency-key")
    if key is not None and len(key) > IDEMPOTENCY_KEY_MAX:
        raise _Invalid(
            [
                {
                    "loc": ("header", "Idempotency-Key"),
                    "msg": f"String should have at most {IDEMPOTENCY_KEY_MAX} characters",
                }
            ]
        )
    return key


async def _create(plane: ControlPlane, request: Request, _: str) -> Response:
    p = await authenticated_user(plane, request)
    key = _idempotency_key(request)
    body = _body(await request.body())
    if body.wait_s is None:
        record, replayed = await create(plane, p, body, key)
    else:
        record, replayed = await _while_connected(create(plane, p, body, key), request)
    response = OrjsonResponse(sandbox_json(record), status_code=201)
    if replayed:
        response.headers["Idempotent-Replayed"] = "true"
    return response


async def _while_connected(
    work: Awaitable[tuple[SandboxRecord, bool]], request: Request
) -> tuple[SandboxRecord, bool]:
    """A create that may wait for capacity, cancelled if its client goes away meanwhile (a parked
    create without an Idempotency-Key is then withdrawn: nobody could come back for it)."""
    task = asyncio.ensure_future(work)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=DISCONNECT_POLL_S)
            if done:
                return task.result()
            if await request.is_disconnected():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
                raise asyncio.CancelledError
    finally:
        if not task.done():
            task.cancel()
            # Its clean-up (withdrawing a keyless parked create) finishes before this answer does.
            await asyncio.wait({task})


async def read_sandbox(plane: ControlPlane, sandbox_id: str, tenant_id: str | None) -> dict[str, object]:
    """GET of one sandbox: its record, with what its disk holds read from its host now."""
    record = await plane.sandboxes.get(sandbox_id, tenant_id)
    body = sandbox_json(record)
    body["disk_used_mb"] = await plane.sandboxes.disk_used_mb(record)
    return body


async def _get(plane: ControlPlane, request: Request, sandbox_id: str) -> Response:
    p = await authenticated_user(plane, request)
    return OrjsonResponse(await read_sandbox(plane, sandbox_id, tenant_scope(p)))


async def _delete(plane: ControlPlane, request: Request, sandbox_id: str) -> Response:
    p = await authenticated_user(plane, request)
    await plane.sandboxes.delete(sandbox_id, tenant_scope(p))
    return Response(status_code=204)


Handler = Callable[[ControlPlane, Request, str], Awaitable[Response]]


def route(method: str, path: str) -> tuple[Handler, str] | None:
    """The hot handler for ``method path`` and the sandbox id in it, or None: FastAPI's to serve."""
    if path == COLLECTION:
        return (_create, "") if method == "POST" else None
    if path.startswith(_ONE):
        sandbox_id = path[len(_ONE) :]
        if not sandbox_id or "/" in sandbox_id:
            return None
        if method == "GET":
            return _get, sandbox_id
        if method == "DELETE":
            return _delete, sandbox_id
    return None


async def _not_here(plane: ControlPlane, request: Request, _: str) -> Response:
    raise ResourceNotFound(f"no hot route {request.method} {request.url.path}")


class HotRoutes:
    """Pure ASGI: the hot routes' endpoint. The app hands it the requests :func:`route` names."""

    def __init__(self, plane: ControlPlane) -> None:
        self.plane = plane

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        handler, sandbox_id = route(scope["method"], scope["path"]) or (_not_here, "")
        request = Request(scope, receive)
        try:
            response = await handler(self.plane, request, sandbox_id)
        except _Invalid as exc:
            response = invalid_request(exc.errors)
        except Exception as exc:
            response = response_for(exc, self.plane.store_unavailable)
        await response(scope, receive, send)
