"""Warm pools over HTTP, admin only: ``POST/GET /v1/pools``, ``GET/PATCH/DELETE /v1/pools/{template}``."""

from __future__ import annotations

from fastapi import APIRouter, Response
from pydantic import Field

from corral.api.auth import Admin, Plane
from corral.api.schemas import TEMPLATE_PATTERN, _Body
from corral.control.pools import PoolStatus
from corral.shapes.pools import Pool, PoolList
from corral.store import UNSET

router = APIRouter()

MAX_POOL_SIZE = 100_000


class PoolBody(_Body):
    template: str = Field(pattern=TEMPLATE_PATTERN)
    size: int = Field(ge=0, le=MAX_POOL_SIZE, strict=True)
    max_per_host: int | None = Field(default=None, gt=0, le=MAX_POOL_SIZE, strict=True)


class PoolPatch(_Body):
    size: int | None = Field(default=None, ge=0, le=MAX_POOL_SIZE, strict=True)
    max_per_host: int | None = Field(default=None, gt=0, le=MAX_POOL_SIZE, strict=True)


def pool_out(s: PoolStatus) -> Pool:
    return Pool(
        template=s.pool.template,
        size=s.pool.size,
        max_per_host=s.pool.max_per_host,
        ready=s.ready,
        starting=s.starting,
        per_host=dict(s.per_host),
        hits=s.hits,
        misses=s.misses,
    )


@router.post("/v1/pools", status_code=201, response_model=Pool)
async def create_pool(body: PoolBody, _: Admin, plane: Plane) -> Pool:
    return pool_out(await plane.pools.create(body.template, body.size, body.max_per_host))


@router.get("/v1/pools", response_model=PoolList)
async def list_pools(_: Admin, plane: Plane) -> PoolList:
    return PoolList(pools=[pool_out(s) for s in await plane.pools.list()])


@router.get("/v1/pools/{template}", response_model=Pool)
async def get_pool(template: str, _: Admin, plane: Plane) -> Pool:
    return pool_out(await plane.pools.get(template))


@router.patch("/v1/pools/{template}", response_model=Pool)
async def update_pool(template: str, body: PoolPatch, _: Admin, plane: Plane) -> Pool:
    # An explicit null clears the per-host cap; leaving the field out keeps it.
    cap = body.max_per_host if "max_per_host" in body.model_fields_set else UNSET
    return pool_out(await plane.pools.update(template, body.size, cap))


@router.delete("/v1/pools/{template}", status_code=204)
async def delete_pool(template: str, _: Admin, plane: Plane) -> Response:
    await plane.pools.delete(template)
    return Response(status_code=204)
