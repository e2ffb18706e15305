"""Tenant keys in the form some e2b SDK versions insist on (``e2b_`` and hex characters), checked
client-side before any call: a corral tenant token like any other, only spelt so those SDKs send it."""

from __future__ import annotations

import secrets
from typing import Annotated

from fastapi import APIRouter, Path

from corral.api.auth import Admin, Plane
from corral.control.errors import ResourceNotFound
from corral.shapes.tenants import E2bKey
from corral.store import Role

router = APIRouter()
PREFIX = "e2b_"


def new_key() -> str:
    return PREFIX + secrets.token_hex(20)


@router.post("/v1/tenants/{name}/e2b-keys", status_code=201, response_model=E2bKey)
async def issue(name: Annotated[str, Path(max_length=128)], _: Admin, plane: Plane) -> E2bKey:
    """A key for the tenant ``name``, as every tenants route names it (its id is still taken, as this
    route took it first)."""
    found = await plane.store.get_tenant_by_name(name) or await plane.store.get_tenant(name)
    if found is None:
        raise ResourceNotFound(f"no tenant {name!r}")
    key = new_key()
    await plane.store.ensure_token(key, found.id, Role.TENANT)
    return E2bKey(tenant_id=found.id, tenant=found.name, key=key)
