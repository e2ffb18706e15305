"""Templates over corral's own API: made by hand (a resource spec), built from a recipe with a build
context, imported from an image archive, listed with their image, version and size, and removed.

Writing a template is an operator's act, as ``POST /v1/templates`` always was (an admin token): a
template's name is fleet-wide, and what a tenant builds for itself goes through E2B's Template SDK
into its own namespace (corral.api.e2b). Listing is for every caller, who sees the operator's
templates and its own, never another tenant's.

- ``POST /v1/templates/{template}/builds``: a recipe (a Dockerfile subset) and the template's sizes; the
  build starts at once, or once its context arrives when ``context`` is true:
- ``PUT /v1/templates/{template}/builds/{id}/context``: the build context, a tar archive (COPY's files);
- ``POST /v1/templates/{template}/imports``: an OCI image layout, a ``docker save`` archive or a plain
  rootfs tarball as the body; the import runs as a build does;
- ``GET /v1/templates/{template}/builds/{id}?offset=N&wait_s=S``: its status and its log from line N (with
  ``wait_s``, answered once there is more to say or after that long);
- ``POST /v1/templates/{template}/builds/{id}/cancel``;
- ``DELETE /v1/templates/{template}``.

A FROM naming a registry's image is checked before the build starts (images/registry.py): a registry that
does not answer is ``registry_unavailable``, never a build that fails later.

Both kinds of build run in the replica's one build service (corral.control.builds), which E2B's build
API shares.
"""

from __future__ import annotations

import asyncio
from typing import Annotated

from fastapi import APIRouter, Query, Request, Response
from fastapi import Path as PathParam
from pydantic import Field

from corral.api.auth import Admin, Plane, User, owner
from corral.api.e2b import names
from corral.api.schemas import MAX_CPUS, MAX_MEMORY_MB, TEMPLATE_PATTERN, TemplateBody, _Body, template_out
from corral.control.builds import BuildService, Job, Sizes
from corral.control.errors import (
    Conflict,
    InvalidRequest,
    RegistryUnavailable,
    ResourceNotFound,
    UnsupportedOption,
)
from corral.control.plane import ControlPlane
from corral.core.types import DEFAULT_TEMPLATE, MAX_SANDBOX_DISK_MB, MIN_SANDBOX_DISK_MB
from corral.images import BlobNotFound, registry
from corral.images.bases import canonical
from corral.images.config import ImageConfig
from corral.images.recipe import MAX_RECIPE_BYTES, Recipe, RecipeError, parse
from corral.shapes.templates import Build, BuildFailure, Template
from corral.store import Principal, Role

router = APIRouter()

# The archives the routes take: a build context's, an image's.
UPLOAD_CAPS = {"context": 512 << 20, "imports": 4 << 30}
MAX_WAIT_S = 30.0
LOG_PAGE = 1000

Name = Annotated[str, PathParam(pattern=TEMPLATE_PATTERN)]
BuildId = Annotated[str, PathParam(pattern=r"^[0-9a-f-]{36}$")]


def upload_cap(path: str, method: str) -> int | None:
    """The body cap of a template upload route (its archive), None for any other route."""
    parts = path.split("/")
    if len(parts) < 5 or parts[1:3] != ["v1", "templates"]:
        return None
    if method == "PUT" and len(parts) == 7 and parts[4] == "builds" and parts[6] == "context":
        return UPLOAD_CAPS["context"]
    if method == "POST" and len(parts) == 5 and parts[4] == "imports":
        return UPLOAD_CAPS["imports"]
    return None


class BuildBody(_Body):
    recipe: str = Field(max_length=MAX_RECIPE_BYTES)
    context: bool = False  # a context archive follows (PUT .../context); the build starts then
    cpus: float = Field(default=1.0, gt=0, le=MAX_CPUS)
    memory_mb: int = Field(default=512, gt=0, le=MAX_MEMORY_MB, strict=True)
    disk_mb: int | None = Field(default=None, ge=MIN_SANDBOX_DISK_MB, le=MAX_SANDBOX_DISK_MB, strict=True)
    description: str = Field(default="", max_length=1024)

    def sizes(self) -> Sizes:
        return Sizes(cpus=self.cpus, memory_mb=self.memory_mb, disk_mb=self.disk_mb)


def build_out(job: Job, offset: int = 0) -> Build:
    lines = [e["message"] for e in job.entries(offset, LOG_PAGE)]
    failure = job.failure
    return Build(
        id=job.id,
        template=job.name,
        status=job.status,
        logs=lines,
        next_offset=offset + len(lines),
        digest=job.digest,
        version=job.version,
        failure=(
            BuildFailure(
                reason=failure.reason,
                message=failure.message,
                step=failure.step,
                line=failure.line,
                output=failure.output[-8192:],
            )
            if failure is not None
            else None
        ),
    )


def _service(request: Request) -> BuildService:
    service: BuildService | None = request.app.state.builds
    if service is None or service.builder is None:
        why = service.unavailable if service is not None else "this control plane does not build templates"
        raise UnsupportedOption("template", f"building templates is not available here: {why}")
    return service


def _operator_name(name: str) -> str:
    """A template an admin builds is the operator's: a tenant's namespace is written by its tenant."""
    if names.foreign(None, name):
        raise InvalidRequest("template", f"{name[:80]!r} is in a tenant's namespace")
    return name


def _sizes(plane: ControlPlane, sizes: Sizes) -> Sizes:
    plane.config.check_memory(sizes.memory_mb)
    return sizes


def _job(request: Request, p: Principal, plane: ControlPlane, name: str, build_id: str) -> Job:
    job = _service(request).job(owner(p, plane), name, build_id)
    if job is None:
        raise ResourceNotFound(f"no build {build_id} of template {name!r}")
    return job


async def _parent(
    service: BuildService, plane: ControlPlane, recipe: Recipe
) -> tuple[str, ImageConfig] | None:
    """What the recipe's FROM names: a base or a registry's image that answers (None), or an operator's
    template with an image."""
    if canonical(recipe.base) is not None:
        return None
    tpl = await plane.store.get_template(recipe.base) if not names.foreign(None, recipe.base) else None
    if tpl is None:
        if service.builder is None or service.builder.pull is None:
            raise RegistryUnavailable(
                recipe.base, registry.unavailable_reason() or "this builder does not pull"
            )
        try:
            await registry.check(recipe.base)
        except registry.RegistryError as exc:
            raise RegistryUnavailable(recipe.base, str(exc)) from None
        return None
    if tpl.image is None:
        raise UnsupportedOption(
            "recipe",
            f"template {recipe.base!r} runs on the host's own root, not an image: it cannot be built from",
        )
    return tpl.image, tpl.image_config or ImageConfig()


# -- the templates ------------------------------------------------------------------------------------


@router.post("/v1/templates", status_code=201, response_model=Template)
async def create_template(body: TemplateBody, _: Admin, plane: Plane) -> Template:
    tpl = await plane.create_template(body.record())
    return template_out(tpl)


@router.get("/v1/templates")
async def list_templates(p: User, plane: Plane) -> dict[str, list[Template]]:
    """The operator's templates and the caller's own (an admin sees every one)."""
    every = await plane.store.list_templates()
    shown = every if p.role is Role.ADMIN else [t for t in every if not names.foreign(p.tenant_id, t.name)]
    sizes = await asyncio.gather(*(_image_size(plane, t.image) for t in shown))
    return {"templates": [template_out(t, size) for t, size in zip(shown, sizes, strict=True)]}


async def _image_size(plane: ControlPlane, digest: str | None) -> int | None:
    blobs = plane.images.blobs
    if digest is None or blobs is None:
        return None
    try:
        return await blobs.size(digest)
    except BlobNotFound:
        return None


@router.delete("/v1/templates/{template}", status_code=204)
async def delete_template(template: Name, _: Admin, plane: Plane) -> Response:
    """The template goes; its sandboxes keep running on their image (collected once none is left).
    A template with a warm pool keeps it: the pool goes first. The built-in ``default`` stays: it
    is what a create that names no template gets."""
    if template == DEFAULT_TEMPLATE:
        raise Conflict(
            f"{DEFAULT_TEMPLATE!r} is the template of every create that names none: it is never removed",
            details={"field": "template"},
        )
    if any(pool.template == template for pool in await plane.store.list_pools()):
        raise Conflict(
            f"template {template!r} has a warm pool: delete the pool first", details={"field": "template"}
        )
    if not await plane.store.delete_template(template):
        raise ResourceNotFound(f"no template {template!r}")
    plane.templates.forget(template)
    return Response(status_code=204)


# -- builds and imports -------------------------------------------------------------------------------


@router.post("/v1/templates/{template}/builds", status_code=202, response_model=Build)
async def start_build(template: Name, body: BuildBody, p: Admin, plane: Plane, request: Request) -> Build:
    service = _service(request)
    try:
        recipe = parse(body.recipe)
    except RecipeError as exc:
        raise InvalidRequest("recipe", str(exc)) from None
    parent = await _parent(service, plane, recipe)
    sizes = _sizes(plane, body.sizes())
    job = service.request(
        owner(p, plane), template, _operator_name(template), sizes, description=body.description
    )
    job.log(f"--> building template {template}")
    if body.context:
        job.awaiting = lambda archive: service.recipe_work(recipe, parent, [archive])
    else:
        service.start(job, service.recipe_work(recipe, parent, []))
    return build_out(job)


@router.put("/v1/templates/{template}/builds/{build_id}/context", status_code=202, response_model=Build)
async def upload_context(
    template: Name, build_id: BuildId, p: Admin, plane: Plane, request: Request
) -> Build:
    """The build's context (a tar archive, gzipped or not); the build starts."""
    service = _service(request)
    job = _job(request, p, plane, template, build_id)
    make = job.awaiting
    if make is None or job.started or job.finished_at is not None:
        raise Conflict(f"build {build_id} takes no context (it did not ask for one, or has it)")
    job.awaiting = None  # one context per build, even while this one is still arriving
    archive = service.root / "contexts" / f"{job.id}.tar"
    await service.start_after_upload(job, archive, request.stream(), UPLOAD_CAPS["context"], make)
    return build_out(job)


@router.post("/v1/templates/{template}/imports", status_code=202, response_model=Build)
async def import_image(
    template: Name,
    p: Admin,
    plane: Plane,
    request: Request,
    cpus: Annotated[float, Query(gt=0, le=MAX_CPUS)] = 1.0,
    memory_mb: Annotated[int, Query(gt=0, le=MAX_MEMORY_MB)] = 512,
    disk_mb: Annotated[int | None, Query(ge=MIN_SANDBOX_DISK_MB, le=MAX_SANDBOX_DISK_MB)] = None,
) -> Build:
    """An image archive as the body: an OCI image layout, a ``docker save`` archive or a rootfs tarball."""
    service = _service(request)
    sizes = _sizes(plane, Sizes(cpus, memory_mb, disk_mb))
    job = service.request(owner(p, plane), template, _operator_name(template), sizes)
    job.log(f"--> importing template {template}")
    archive = service.root / "imports" / f"{job.id}.tar"
    await service.start_after_upload(
        job, archive, request.stream(), UPLOAD_CAPS["imports"], service.import_work
    )
    return build_out(job)


@router.get("/v1/templates/{template}/builds/{build_id}", response_model=Build)
async def get_build(
    template: Name,
    build_id: BuildId,
    p: Admin,
    plane: Plane,
    request: Request,
    offset: Annotated[int, Query(ge=0, le=1 << 30)] = 0,
    wait_s: Annotated[float, Query(ge=0, le=MAX_WAIT_S)] = 0.0,
) -> Build:
    """Its status and log from ``offset``; with ``wait_s``, once it has a line past ``offset`` or has
    ended, or after that long."""
    job = _job(request, p, plane, template, build_id)
    loop = asyncio.get_running_loop()
    until = loop.time() + wait_s
    while len(job.logs) <= offset and job.finished_at is None and loop.time() < until:
        await asyncio.sleep(0.1)
    return build_out(job, offset)


@router.post("/v1/templates/{template}/builds/{build_id}/cancel", response_model=Build)
async def cancel_build(template: Name, build_id: BuildId, p: Admin, plane: Plane, request: Request) -> Build:
    job = _job(request, p, plane, template, build_id)
    await _service(request).cancel(job, MAX_WAIT_S)
    return build_out(job)
