"""The Kubernetes API for corral's resources (docs/kubernetes.md): agent-sandbox's Sandbox,
SandboxTemplate, SandboxWarmPool and SandboxClaim, namespaced by tenant, served from the same records
and operations as ``/v1`` so that a real ``kubectl`` works against ``corral serve``.

:func:`install` puts its paths (``/api``, ``/apis``, ``/openapi/v2``, ``/openapi/v3``, ``/version``)
in front of corral's own routes, every error as a Kubernetes ``Status``; the leader prunes the change
feed's history.
"""

from __future__ import annotations

from fastapi import FastAPI
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from corral.api.kube import discovery
from corral.api.kube.access import Namespaces
from corral.api.kube.events import Events
from corral.api.kube.feed import HISTORY, ChangeHub
from corral.api.kube.frontproxy import FrontProxy
from corral.api.kube.kinds import GROUPS, VERSION
from corral.api.kube.objects import Objects
from corral.api.kube.routes import Surface
from corral.api.kube.status import kube_error, status_response
from corral.api.limits import BodyLimit
from corral.codes import ErrorCode
from corral.control.errors import ResourceNotFound
from corral.control.plane import ControlPlane
from corral.core.frontproxy import FrontProxyPolicy

PREFIXES = ("/api", "/openapi/v2", "/openapi/v3", "/version")


def build(plane: ControlPlane, front_proxy: FrontProxyPolicy | None = None) -> tuple[Starlette, ChangeHub]:
    """``front_proxy``: trust a Kubernetes aggregator's identity headers (its client certificate
    verified by the listener against the request-header CA), mapped so."""
    namespaces = Namespaces(plane, FrontProxy(plane, front_proxy) if front_proxy is not None else None)
    hub = ChangeHub(plane.store)
    objects = Objects(plane, namespaces)
    surface = Surface(objects, namespaces, hub)
    happened = Events(objects, namespaces, surface.version)

    async def authed(request: Request) -> None:
        await namespaces.access(request, None)

    async def known_version(request: Request) -> str:
        """The group a request names, if it is one of ours at our version (after its token)."""
        await authed(request)
        name, v = request.path_params["group"], request.path_params["version"]
        if name not in GROUPS or v != VERSION:
            raise ResourceNotFound(f"no group version {name}/{v}")
        return str(name)

    async def version(request: Request) -> Response:
        return JSONResponse(discovery.version())

    async def api(request: Request) -> Response:
        # No core group: kubectl tolerates its absence.
        return status_response(404, "corral serves no core (v1) resources", ErrorCode.NOT_FOUND)

    async def apis(request: Request) -> Response:
        await authed(request)
        return JSONResponse(discovery.group_list())

    async def group(request: Request) -> Response:
        await authed(request)
        name = request.path_params["group"]
        if name not in GROUPS:
            raise ResourceNotFound(f"no group {name}")
        return JSONResponse(discovery.group(name))

    async def group_version(request: Request) -> Response:
        return JSONResponse(discovery.resources(await known_version(request)))

    async def openapi_index(request: Request) -> Response:
        await authed(request)
        return JSONResponse(discovery.openapi_index())

    async def openapi_doc(request: Request) -> Response:
        return JSONResponse(discovery.openapi(await known_version(request)))

    async def openapi_v2(request: Request) -> Response:
        return status_response(404, "OpenAPI v2 is not served: use /openapi/v3", ErrorCode.NOT_FOUND)

    base = "/apis/{group}/{version}"
    routes = [
        Route("/version", version),
        Route("/api", api),
        Route("/api/v1/events", happened.list),
        Route("/api/v1/namespaces/{namespace}/events", happened.list),
        Route("/api/{rest:path}", api),
        Route("/apis", apis),
        Route("/openapi/v2", openapi_v2),
        Route("/openapi/v3", openapi_index),
        Route("/openapi/v3/apis/{group}/{version}", openapi_doc),
        Route("/apis/{group}", group),
        Route(base, group_version),
        Route(base + "/{plural}", surface.collection, methods=["GET"]),
        Route(base + "/namespaces/{namespace}/{plural}", surface.collection, methods=["GET", "POST"]),
        Route(
            base + "/namespaces/{namespace}/{plural}/{name}",
            surface.item,
            methods=["GET", "PATCH", "PUT", "DELETE"],
        ),
        Route(
            base + "/namespaces/{namespace}/{plural}/{name}/{sub}",
            surface.item,
            methods=["GET", "PATCH", "PUT", "DELETE"],
        ),
    ]

    async def not_found(request: Request, exc: Exception) -> Response:
        code = getattr(exc, "status_code", 404)
        return status_response(
            code,
            f"the server could not find the requested resource ({request.url.path})"
            if code == 404
            else str(getattr(exc, "detail", "")),
            ErrorCode.NOT_FOUND if code == 404 else ErrorCode.HTTP_ERROR,
        )

    # Inside Starlette's own error layer, which would answer a bare 500 first.
    app = Starlette(
        routes=routes,
        middleware=[Middleware(KubeErrors, plane=plane)],
        exception_handlers={404: not_found, 405: not_found},
    )
    app.state.plane = plane
    return app, hub


class KubeErrors:
    """Every failure before the answer started, as a Kubernetes ``Status``."""

    def __init__(self, app: ASGIApp, plane: ControlPlane) -> None:
        self.app, self.plane = app, plane

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = False

        async def tracked(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracked)
        except Exception as exc:
            if started:
                raise
            await kube_error(self.plane, exc)(scope, receive, send)


def install(app: FastAPI, plane: ControlPlane, front_proxy: FrontProxyPolicy | None = None) -> None:
    kube, hub = build(plane, front_proxy)
    app.state.kube_hub = hub
    plane.reconciler.leader_work.append(lambda: plane.store.prune_changes(HISTORY))
    app.add_middleware(KubeDispatch, kube=BodyLimit(kube))


class KubeDispatch:
    """The Kubernetes paths to their surface; everything else to corral's own routes."""

    def __init__(self, app: ASGIApp, kube: ASGIApp) -> None:
        self.app, self.kube = app, kube

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith(PREFIXES):
            return await self.kube(scope, receive, send)
        await self.app(scope, receive, send)
