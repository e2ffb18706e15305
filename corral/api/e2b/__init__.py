"""E2B compatibility: the unmodified ``e2b`` SDK against corral (docs/e2b.md).

:func:`install` puts both planes on the control plane's app: E2B's control-plane routes (errors in
E2B's ``{"code", "message"}`` shape, corral's stable code beside it as ``error_code``), and the data
plane for calls that carry ``E2b-Sandbox-Id``.
"""

from __future__ import annotations

import json

from fastapi import FastAPI
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from corral.api import errors
from corral.api.e2b import unserved
from corral.api.e2b.access import AccessKey
from corral.api.e2b.builds import MAX_UPLOAD_BYTES, E2BBuilds
from corral.api.e2b.control import router
from corral.api.e2b.dataplane import DataPlane, is_data_plane
from corral.api.e2b.keys import router as keys_router
from corral.api.e2b.templates import router as templates_router
from corral.api.limits import BodyLimit
from corral.control.plane import ControlPlane

CONTROL_PREFIXES = (
    "/sandboxes",
    "/v2/sandboxes",
    "/templates/",
    "/v2/templates/",
    "/v3/templates",
    *unserved.PREFIXES,
)


def install(app: FastAPI, plane: ControlPlane, builds: E2BBuilds | None = None) -> None:
    """``builds``: where the Template SDK's builds run (None: this replica refuses them)."""
    secret = AccessKey(plane.store)
    control = FastAPI(openapi_url=None, docs_url=None, redoc_url=None)
    control.state.plane = plane
    control.state.e2b_access = secret
    control.state.e2b_builds = builds
    errors.install(control, plane.store_unavailable)
    control.include_router(unserved.router)  # first: /sandboxes/metrics is not a sandbox's id
    control.include_router(router)
    control.include_router(templates_router)
    app.state.e2b_access = secret
    app.include_router(keys_router)  # an admin route of corral's own API, in its error shape
    app.add_middleware(
        Dispatch,
        control=E2BErrors(BodyLimit(control)),
        uploads=E2BErrors(BodyLimit(control, default=MAX_UPLOAD_BYTES)),
        data=DataPlane(plane, secret),
    )


def _is_upload(scope: Scope) -> bool:
    """A COPY's archive: ``PUT /templates/{id}/files/{hash}`` (a body far larger than an API call's)."""
    parts = scope["path"].split("/")
    return scope["method"] == "PUT" and len(parts) == 5 and parts[1] == "templates" and parts[3] == "files"


class Dispatch:
    """E2B's paths to their handlers; everything else to corral's own routes."""

    def __init__(self, app: ASGIApp, control: ASGIApp, uploads: ASGIApp, data: ASGIApp) -> None:
        self.app, self.control, self.uploads, self.data = app, control, uploads, data

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            if is_data_plane(scope):
                return await self.data(scope, receive, send)
            path: str = scope["path"]
            if path.startswith(CONTROL_PREFIXES):
                return await (self.uploads if _is_upload(scope) else self.control)(scope, receive, send)
        await self.app(scope, receive, send)


class E2BErrors:
    """corral's error body ``{"error": {"code", "message", ...}}`` reshaped as E2B's, status and
    headers (Retry-After) untouched."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        start: Message | None = None
        chunks: list[bytes] = []

        async def reshape(message: Message) -> None:
            nonlocal start
            if message["type"] == "http.response.start" and message["status"] >= 400:
                start = message
                return
            if start is None:
                await send(message)
                return
            chunks.append(message.get("body", b""))
            if message.get("more_body"):
                return
            body = b"".join(chunks)
            try:
                err = json.loads(body)["error"]
                body = json.dumps(
                    {"code": start["status"], "message": err["message"], "error_code": err["code"]}
                ).encode()
            except (ValueError, KeyError, TypeError):
                pass
            headers = [(k, v) for k, v in start["headers"] if k.lower() != b"content-length"]
            headers.append((b"content-length", str(len(body)).encode()))
            await send({**start, "headers": headers})
            await send({"type": "http.response.body", "body": body})

        await self.app(scope, receive, reshape)
