"""E2B's template build routes, as SDK 2.63.0's ``Template.build`` calls them (authenticated by the
tenant's ``X-API-KEY``; errors in E2B's shape):

- ``POST /v3/templates``: a build is requested for a name (the tenant's own namespace, names.py);
- ``GET /templates/{id}/files/{hash}``: whether a COPY's files are here, and where to upload them (this
  same path, ``PUT``, with the caller's own key as the header to send);
- ``POST /v2/templates/{id}/builds/{buildID}``: the steps; the build starts (translate.py, builds.py);
- ``GET /templates/{id}/builds/{buildID}/status``: its state, its log from ``logsOffset``, and why it
  failed (the step's number, as the SDK names steps);
- ``GET /templates/aliases/{alias}``: whether the tenant has a template of that name.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from fastapi import APIRouter, Body, Query, Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from corral.api.e2b import names
from corral.api.e2b.builds import E2BBuilds, Sizes, status_json
from corral.api.e2b.control import caller
from corral.api.e2b.translate import from_template, plan
from corral.api.schemas import MAX_CPUS, MAX_MEMORY_MB
from corral.control.errors import Forbidden, InvalidRequest, ResourceNotFound, UnsupportedOption
from corral.control.plane import ControlPlane
from corral.core.types import MAX_SANDBOX_DISK_MB, MIN_SANDBOX_DISK_MB
from corral.images.config import ImageConfig
from corral.store import Principal

router = APIRouter()
DEFAULT_SIZES = Sizes()

JsonBody = Annotated[dict[str, Any], Body()]


class NewBuild(BaseModel):
    """TemplateBuildRequestV3."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)
    name: str | None = Field(default=None, max_length=256)
    alias: str | None = Field(default=None, max_length=256)
    tags: list[str] | None = Field(default=None, max_length=16)
    team_id: str | None = Field(default=None, alias="teamID", max_length=128)
    cpu_count: int | None = Field(default=None, alias="cpuCount", ge=1, le=int(MAX_CPUS))
    memory_mb: int | None = Field(default=None, alias="memoryMB", gt=0, le=MAX_MEMORY_MB)
    min_free_disk_mb: int | None = Field(default=None, alias="minFreeDiskMb", ge=0, le=MAX_SANDBOX_DISK_MB)


def _builds(request: Request) -> E2BBuilds:
    builds: E2BBuilds | None = request.app.state.e2b_builds
    if builds is None:
        raise UnsupportedOption("template", "this control plane does not build templates")
    return builds


async def _tenant(request: Request) -> tuple[ControlPlane, Principal, str]:
    plane, p = await caller(request)
    if p.tenant_id is None:
        raise Forbidden("templates are built with a tenant's key")
    return plane, p, p.tenant_id


def _name(new: NewBuild) -> str:
    name = new.name or new.alias
    if not name:
        raise InvalidRequest("name", "a template build names its template")
    if ":" in name or new.tags:
        raise UnsupportedOption("tags", "template tags are not supported: a build replaces its template")
    if not re.fullmatch(names.NAME_PATTERN, name):
        raise InvalidRequest("name", f"a template name is letters, digits, '_', '.' and '-': {name[:80]!r}")
    return name


def _sizes(plane: ControlPlane, new: NewBuild) -> Sizes:
    memory = new.memory_mb or DEFAULT_SIZES.memory_mb
    plane.config.check_memory(memory, "memoryMB")
    disk = max(MIN_SANDBOX_DISK_MB, new.min_free_disk_mb) if new.min_free_disk_mb else None
    return Sizes(cpus=float(new.cpu_count or DEFAULT_SIZES.cpus), memory_mb=memory, disk_mb=disk)


@router.post("/v3/templates", status_code=202)
async def request_build(request: Request, body: JsonBody) -> JSONResponse:
    plane, _, tenant = await _tenant(request)
    builds = _builds(request)
    try:
        new = NewBuild.model_validate(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise InvalidRequest(".".join(map(str, first["loc"])) or "body", first["msg"]) from None
    name = _name(new)
    job = builds.request(tenant, name, _sizes(plane, new))
    answer = {
        "templateID": name,
        "buildID": job.id,
        "public": False,
        "names": [name],
        "tags": [],
        "aliases": [name],
    }
    return JSONResponse(answer, status_code=202)


@router.get("/templates/{template_id}/files/{files_hash}", status_code=201)
async def upload_link(request: Request, template_id: str, files_hash: str) -> JSONResponse:
    builds, tenant = await _upload_to(request, template_id, files_hash)
    if builds.present(tenant, files_hash):
        return JSONResponse({"present": True}, status_code=201)
    url = str(request.url.replace(query=""))
    key = request.headers.get("x-api-key", "")
    return JSONResponse({"present": False, "url": url, "headers": {"X-API-KEY": key}}, status_code=201)


@router.put("/templates/{template_id}/files/{files_hash}", status_code=200)
async def upload(request: Request, template_id: str, files_hash: str) -> Response:
    builds, tenant = await _upload_to(request, template_id, files_hash)
    await builds.receive(tenant, files_hash, request.stream())
    return Response(status_code=200)


@router.post("/v2/templates/{template_id}/builds/{build_id}", status_code=202)
async def start_build(request: Request, template_id: str, build_id: str, body: JsonBody) -> Response:
    plane, p, tenant = await _tenant(request)
    builds = _builds(request)
    job = builds.job(tenant, template_id, build_id)
    if job is None:
        raise ResourceNotFound(f"no build {build_id[:64]} of template {template_id!r}")
    base = from_template(body)
    parent = await _parent(plane, p, base) if base is not None else None
    builds.start(job, plan(body, parent[1] if parent is not None else None), parent)
    return Response(status_code=202)


@router.get("/templates/{template_id}/builds/{build_id}/status")
async def build_status(
    request: Request,
    template_id: str,
    build_id: str,
    logs_offset: Annotated[int, Query(alias="logsOffset", ge=0)] = 0,
    limit: Annotated[int, Query(ge=1, le=100)] = 100,
    level: Annotated[str | None, Query(pattern=r"^(debug|info|warn|error)$")] = None,
) -> JSONResponse:
    _, _, tenant = await _tenant(request)
    job = _builds(request).job(tenant, template_id, build_id)
    if job is None:
        raise ResourceNotFound(f"no build {build_id[:64]} of template {template_id!r}")
    return JSONResponse(status_json(job, logs_offset, limit, level))


@router.get("/templates/aliases/{alias}")
async def alias(request: Request, alias: str) -> JSONResponse:
    plane, _, tenant = await _tenant(request)
    if await plane.store.get_template(names.owned(tenant, alias)) is None:
        raise ResourceNotFound(f"no template {alias!r}")
    return JSONResponse({"templateID": alias, "public": False})


async def _upload_to(request: Request, template_id: str, files_hash: str) -> tuple[E2BBuilds, str]:
    """The builds and the caller's tenant, for files of ``files_hash`` sent to a build of
    ``template_id`` that the tenant requested."""
    _, _, tenant = await _tenant(request)
    builds = _builds(request)
    _check_hash(files_hash)
    if not builds.has_open(tenant, template_id):
        raise ResourceNotFound(f"no build of template {template_id!r} was requested")
    return builds, tenant


def _check_hash(files_hash: str) -> None:
    if not re.fullmatch(r"[0-9a-f]{64}", files_hash):
        raise InvalidRequest("hash", "a files hash is 64 lower-case hex digits")


async def _parent(plane: ControlPlane, p: Principal, name: str) -> tuple[str, ImageConfig]:
    """The image and config of the template a build starts from: the caller's own first, else an
    operator's; never another tenant's."""
    if names.foreign(p.tenant_id, name):
        raise InvalidRequest("fromTemplate", f"unknown template {name!r}")
    tpl = None
    if p.tenant_id is not None:
        tpl = await plane.store.get_template(names.owned(p.tenant_id, name))
    tpl = tpl or await plane.store.get_template(name)
    if tpl is None:
        raise InvalidRequest("fromTemplate", f"unknown template {name!r}")
    if tpl.image is None:
        raise UnsupportedOption(
            "fromTemplate",
            f"template {name!r} runs on the host's own root, not an image: it cannot be built from",
        )
    return tpl.image, tpl.image_config or ImageConfig()
