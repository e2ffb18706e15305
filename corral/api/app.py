"""The ASGI application: one control plane behind FastAPI. Tests plug this callable into an httpx
transport; servers hand it to uvicorn."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI
from starlette.types import ASGIApp, Receive, Scope, Send

from corral import __version__
from corral.api import commands, dashboard, domains, e2b, errors, kube, pools, templates
from corral.api.e2b.builds import E2BBuilds
from corral.api.hot import HotRoutes, route
from corral.api.limits import BodyLimit
from corral.api.ports import Ports
from corral.api.requestlog import RequestLog
from corral.api.routes import router
from corral.control.builds import BuildService
from corral.control.plane import ControlPlane
from corral.core.frontproxy import FrontProxyPolicy


class CorralApp(FastAPI):
    """FastAPI, with the hot routes answered in front of its middleware stack (``hot``: the request
    log and the body cap around :class:`HotRoutes`), which costs more than the rest of a create."""

    hot: ASGIApp | None = None
    # In front of everything: requests to sandboxes' ports (by Host, by path, by custom domain).
    ports: ASGIApp | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.ports is not None:
            await self.ports(scope, receive, send)
        else:
            await self.dispatch(scope, receive, send)

    async def dispatch(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.hot is not None and scope["type"] == "http" and route(scope["method"], scope["path"]):
            scope["app"] = self
            await self.hot(scope, receive, send)
        else:
            await super().__call__(scope, receive, send)


def create_app(
    plane: ControlPlane,
    *,
    admin_token: str | None = None,
    agent_token: str | None = None,
    manage: bool = True,
    on_shutdown: Callable[[], Awaitable[None]] | None = None,
    hot_routes: bool = True,
    metrics_open: bool = False,
    builds: BuildService | None = None,
    front_proxy: FrontProxyPolicy | None = None,
) -> CorralApp:
    """``manage``: start and stop the control plane with the app's lifespan. ``on_shutdown`` runs at
    the end of it: the server's own shutdown, before uvicorn hands a SIGTERM or SIGINT back to the
    process (code after ``Server.serve()`` returns may never run). ``hot_routes``: answer the create,
    get and delete of a sandbox in front of FastAPI's middleware stack (off, the declared routes serve
    them: the reference the fast layer is tested against). ``metrics_open``: /metrics without a token,
    for a listener that only the scraper can reach. ``builds``: where template builds run, of corral's API
    and of E2B's Template SDK (None: refused). ``front_proxy``: the Kubernetes surface trusts an
    aggregator's identity headers (the listener verifies its client certificate:
    :func:`corral.api.server.api_server`)."""

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        if manage:
            await plane.start(admin_token=admin_token, agent_token=agent_token)
        try:
            yield
        finally:
            if manage:
                await plane.stop()
            if on_shutdown is not None:
                await on_shutdown()

    app = CorralApp(title="corral", version=__version__, lifespan=lifespan)
    app.state.plane = plane
    app.state.metrics_open = metrics_open
    errors.install(app, plane.store_unavailable)
    app.include_router(router)
    app.include_router(commands.router)
    app.include_router(pools.router)
    app.include_router(domains.router)
    app.include_router(templates.router)
    app.state.builds = builds
    app.add_middleware(BodyLimit, uploads=templates.upload_cap)
    # In front of the body cap: E2B's data plane streams files under caps of its own.
    e2b.install(app, plane, E2BBuilds(builds) if builds is not None else None)
    app.ports = Ports(app.dispatch, plane, app.state.e2b_access)
    kube.install(app, plane, front_proxy)
    app.include_router(dashboard.router)
    app.state.dashboard_key = dashboard.session_key(admin_token)
    errors.document_errors(app)
    app.add_middleware(RequestLog, replica=plane.config.replica_id)
    if hot_routes:
        app.hot = RequestLog(BodyLimit(HotRoutes(plane)), replica=plane.config.replica_id)
    return app
