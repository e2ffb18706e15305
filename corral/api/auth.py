"""Bearer tokens -> principals. Tokens are stored hashed; roles decide which routes answer."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from corral.control.errors import Forbidden
from corral.control.plane import ControlPlane
from corral.store import Principal, Role


async def plane_of(request: Request) -> ControlPlane:
    # async on purpose: FastAPI runs a plain ``def`` dependency in a thread pool, on every request
    plane: ControlPlane = request.app.state.plane
    return plane


Plane = Annotated[ControlPlane, Depends(plane_of)]


def _bearer(request: Request) -> str | None:
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


async def principal(request: Request, plane: Plane) -> Principal:
    return await plane.authenticate(_bearer(request))


Caller = Annotated[Principal, Depends(principal)]


def as_user(p: Principal) -> Principal:
    """A tenant or an admin: who may own sandboxes (agent and metrics tokens have one route each)."""
    if p.role is Role.AGENT:
        raise Forbidden("agent tokens may only heartbeat and fetch images")
    if p.role is Role.METRICS:
        raise Forbidden("metrics tokens may only read /metrics")
    return p


async def authenticated_user(plane: ControlPlane, request: Request) -> Principal:
    return as_user(await plane.authenticate(_bearer(request)))


async def user(request: Request) -> Principal:
    # One dependency, not a chain.
    return await authenticated_user(request.app.state.plane, request)


async def admin(p: Caller) -> Principal:
    if p.role is not Role.ADMIN:
        raise Forbidden("this route needs an admin token")
    return p


async def metrics_reader(request: Request, plane: Plane) -> Principal | None:
    """The admin or a metrics token; None when this listener serves /metrics open (``metrics_open``,
    for a listener only the scraper reaches)."""
    if request.app.state.metrics_open:
        return None
    p = await plane.authenticate(_bearer(request))
    if p.role not in (Role.ADMIN, Role.METRICS):
        raise Forbidden("/metrics needs the admin token or a metrics token")
    return p


async def agent(p: Caller) -> Principal:
    if p.role is not Role.AGENT:
        raise Forbidden("this route needs an agent token")
    return p


User = Annotated[Principal, Depends(user)]
Admin = Annotated[Principal, Depends(admin)]
Agent = Annotated[Principal, Depends(agent)]
MetricsReader = Annotated[Principal | None, Depends(metrics_reader)]


def scope(p: Principal) -> str | None:
    """The tenant whose sandboxes ``p`` may see: all of them for an admin."""
    return None if p.role is Role.ADMIN else p.tenant_id


def owner(p: Principal, plane: ControlPlane) -> str:
    """The tenant a new sandbox belongs to."""
    tenant = p.tenant_id or plane.default_tenant_id
    if tenant is None:
        raise Forbidden("this token belongs to no tenant")
    return tenant
