"""Tenant keys in the form some e2b SDK versions insist on (``e2b_`` and hex characters), checked
client-side before any call: a corral tenant token like any other, only spelt so those SDKs send it."""

from __future__ import annotations

import secrets

from fastapi import APIRouter
from pydantic import BaseModel

from corral.api.auth import Admin, Plane
from corral.control.errors import ResourceNotFound
from corral.store import Role

router = APIRouter()
PREFIX = "e2b_"


def new_key() -> str:
    return PREFIX + secrets.token_hex(20)


class KeyOut(BaseModel):
    tenant_id: str
    key: str


@router.post("/v1/tenants/{tenant_id}/e2b-keys", status_code=201, response_model=KeyOut)
async def issue(tenant_id: str, _: Admin, plane: Plane) -> KeyOut:
    if await plane.store.get_tenant(tenant_id) is None:
        raise ResourceNotFound(f"no tenant {tenant_id}")
    key = new_key()
    await plane.store.ensure_token(key, tenant_id, Role.TENANT)
    return KeyOut(tenant_id=tenant_id, key=key)
