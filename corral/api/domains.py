"""Custom domains over HTTP: ``POST /v1/sandboxes/{id}/domains`` binds a hostname to one of the
sandbox's ports (201; 409 ``domain_taken`` when another live sandbox holds it, fleet-wide),
``GET`` lists them, ``DELETE /v1/sandboxes/{id}/domains/{hostname}`` removes one. A sandbox's
domains go with its record. Requests whose Host is a bound name are routed like its ports
(:mod:`corral.api.ports`)."""

from __future__ import annotations

from fastapi import APIRouter, Response
from pydantic import Field

from corral.api.auth import Plane, User, scope
from corral.api.schemas import _Body
from corral.control.errors import InvalidRequest, ResourceNotFound
from corral.core.ingress import MAX_HOSTNAME, custom_hostname
from corral.shapes.domains import Domain, DomainList
from corral.store import DomainRecord

router = APIRouter()


class DomainBody(_Body):
    hostname: str = Field(min_length=1, max_length=MAX_HOSTNAME + 1)
    port: int = Field(ge=1, le=65535, strict=True)


def domain_out(d: DomainRecord) -> Domain:
    return Domain(hostname=d.hostname, sandbox_id=d.sandbox_id, port=d.port)


def _name(plane: Plane, text: str) -> str:
    try:
        return custom_hostname(text, plane.config.domain)
    except ValueError as exc:
        raise InvalidRequest("hostname", f"hostname: {exc}") from None


@router.post("/v1/sandboxes/{sandbox_id}/domains", status_code=201, response_model=Domain)
async def bind_domain(sandbox_id: str, body: DomainBody, p: User, plane: Plane) -> Domain:
    name = _name(plane, body.hostname)
    await plane.sandboxes.get(sandbox_id, scope(p))  # another tenant's sandbox is not found
    return domain_out(await plane.store.bind_domain(name, sandbox_id, body.port))


@router.get("/v1/sandboxes/{sandbox_id}/domains", response_model=DomainList)
async def list_domains(sandbox_id: str, p: User, plane: Plane) -> DomainList:
    await plane.sandboxes.get(sandbox_id, scope(p))
    return DomainList(domains=[domain_out(d) for d in await plane.store.list_domains(sandbox_id)])


@router.delete("/v1/sandboxes/{sandbox_id}/domains/{hostname}", status_code=204)
async def unbind_domain(sandbox_id: str, hostname: str, p: User, plane: Plane) -> Response:
    await plane.sandboxes.get(sandbox_id, scope(p))
    if not await plane.store.unbind_domain(_name(plane, hostname), sandbox_id):
        raise ResourceNotFound(f"sandbox {sandbox_id} holds no domain {hostname[:64]!r}")
    return Response(status_code=204)
