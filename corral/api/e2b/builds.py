"""E2B's template builds on this replica: the small adapter between E2B's build API (templates.py) and
corral's builder (:class:`corral.images.builder.Builder`).

A build is requested (``POST /v3/templates``), gets its COPY steps' files uploaded (one tar archive
per files hash, kept per tenant), is started with its steps (translate.py), runs in the builder's
build sandboxes while its log lines collect here, and on success names the tenant's template
(``<tenant id>.<name>``, names.py) after the new image: a rebuild replaces the template, sandboxes
keep the image they started on.

What it holds is this replica's memory: a build is polled on the replica that runs it (one for
``corral serve``). Builds run one or two at a time per replica and a tenant has a few at once; the
uploads a tenant keeps are capped, the oldest dropped first.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
import os
import shutil
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from corral.api.e2b import names
from corral.api.e2b.translate import BuildPlan
from corral.control.errors import Conflict, InvalidRequest, PayloadTooLarge, TooManyConcurrent
from corral.control.plane import ControlPlane
from corral.images.builder import Builder, BuildFailed, BuildLimits
from corral.images.config import ImageConfig
from corral.store import TemplateRecord

log = logging.getLogger("corral.api.e2b.builds")

MAX_UPLOAD_BYTES = 512 << 20  # one COPY's archive
MAX_TENANT_UPLOAD_BYTES = 2 << 30  # what one tenant's uploads may hold on this replica
MAX_OPEN_BUILDS = 4  # a tenant's builds requested or running at once
MAX_RUNNING = 2  # builds running at once on this replica
MAX_LOG_LINES = 20_000
KEEP_S = 3600.0  # a finished build (or one requested and never started) is forgotten after this
HOST_CA_FILE = "/etc/ssl/certs/ca-certificates.crt"


def unavailable_reason() -> str | None:
    """Why this machine cannot build images (None: it can)."""
    if os.geteuid() != 0:
        return "building templates needs a control plane running as root (mounts, user namespaces)"
    for tool in ("bwrap", "mkfs.erofs", "mkfs.ext4"):
        if shutil.which(tool) is None:
            return f"building templates needs {tool} on the control plane's machine (`make system-deps`)"
    return None


def build_limits(*, network: bool, timeout_s: float = 900.0, disk_mb: int = 4096) -> BuildLimits:
    """The limits of a tenant's build: with the network, the host's CA bundle is trusted inside."""
    ca = HOST_CA_FILE if network and os.path.exists(HOST_CA_FILE) else None
    return BuildLimits(timeout_s=timeout_s, disk_mb=disk_mb, network=network, ca_file=ca)


def _iso(ts: float) -> str:
    return datetime.datetime.fromtimestamp(ts, datetime.UTC).isoformat().replace("+00:00", "Z")


@dataclass(frozen=True, slots=True)
class Sizes:
    """What the template's sandboxes get (E2B's cpuCount, memoryMB, minFreeDiskMb)."""

    cpus: float = 1.0
    memory_mb: int = 512
    disk_mb: int | None = None


@dataclass
class Job:
    id: str
    tenant_id: str
    name: str  # the E2B name (the templateID the SDK polls under)
    sizes: Sizes
    created_at: float
    status: str = "waiting"  # waiting (requested), building, ready, error: E2B's own words
    logs: list[dict[str, Any]] = field(default_factory=list)
    reason: dict[str, Any] | None = None
    started: bool = False
    finished_at: float | None = None
    task: asyncio.Task[None] | None = None

    def log(self, message: str, level: str = "info") -> None:
        if len(self.logs) < MAX_LOG_LINES:
            self.logs.append({"timestamp": _iso(time.time()), "level": level, "message": message})
        elif len(self.logs) == MAX_LOG_LINES:
            self.logs.append({"timestamp": _iso(time.time()), "level": "warn", "message": "(log cut here)"})

    def fail(self, message: str, step: str | None, output: str = "") -> None:
        self.log(message, "error")
        tail = [
            {"timestamp": _iso(time.time()), "level": "error", "message": line}
            for line in output.strip().splitlines()[-20:]
        ]
        self.reason = {"message": message, **({"step": step} if step else {}), "logEntries": tail}
        self.status = "error"

    def status_json(self, offset: int, limit: int, level: str | None) -> dict[str, Any]:
        entries = self.logs[offset : offset + limit]
        if level is not None:
            order = ("debug", "info", "warn", "error")
            entries = [e for e in entries if order.index(e["level"]) >= order.index(level)]
        out: dict[str, Any] = {
            "templateID": self.name,
            "buildID": self.id,
            "status": self.status,
            "logs": [],
            "logEntries": entries,
        }
        if self.reason is not None:
            out["reason"] = self.reason
        return out


def _step_name(exc: BuildFailed) -> str | None:
    """The SDK's name of the step that failed: its index (1-based), ``base`` for the base."""
    if exc.step:
        return str(exc.line) if exc.line else "base"
    return "base" if exc.reason == "refused" else None


class E2BBuilds:
    """``builder`` None: this replica does not build (``unavailable`` says why)."""

    def __init__(
        self,
        plane: ControlPlane,
        builder: Builder | None,
        uploads: Path,
        limits: BuildLimits,
        *,
        unavailable: str | None = None,
    ) -> None:
        self.plane = plane
        self.builder = builder
        self.uploads = uploads
        self.limits = limits
        self.unavailable = unavailable or (
            None if builder is not None else "this control plane does not build"
        )
        self.jobs: dict[str, Job] = {}
        self._running = asyncio.Semaphore(MAX_RUNNING)
        self._names: dict[str, asyncio.Lock] = {}

    # -- requests ----------------------------------------------------------------------------------------

    def _forget_old(self) -> None:
        now = time.time()
        for job_id, job in list(self.jobs.items()):
            done = (
                job.finished_at if job.finished_at is not None else (None if job.started else job.created_at)
            )
            if done is not None and now - done > KEEP_S:
                del self.jobs[job_id]

    def request(self, tenant_id: str, name: str, sizes: Sizes) -> Job:
        self._forget_old()
        open_builds = [j for j in self.jobs.values() if j.tenant_id == tenant_id and j.finished_at is None]
        if len(open_builds) >= MAX_OPEN_BUILDS:
            # A request never started (its start refused, or abandoned) gives way to a new one.
            idle = [j for j in open_builds if not j.started]
            if idle:
                oldest = min(idle, key=lambda j: j.created_at)
                del self.jobs[oldest.id]
                open_builds.remove(oldest)
        if len(open_builds) >= MAX_OPEN_BUILDS:
            raise TooManyConcurrent(
                f"a tenant has at most {MAX_OPEN_BUILDS} template builds requested or running at once",
                details={"scope": "tenant", "limit": MAX_OPEN_BUILDS},
            )
        job = Job(id=str(uuid.uuid4()), tenant_id=tenant_id, name=name, sizes=sizes, created_at=time.time())
        self.jobs[job.id] = job
        return job

    def job(self, tenant_id: str, name: str, build_id: str) -> Job | None:
        job = self.jobs.get(build_id)
        return job if job is not None and job.tenant_id == tenant_id and job.name == name else None

    def has_open(self, tenant_id: str, name: str) -> bool:
        return any(j.tenant_id == tenant_id and j.name == name for j in self.jobs.values())

    # -- uploads -----------------------------------------------------------------------------------------

    def _upload(self, tenant_id: str, files_hash: str) -> Path:
        return self.uploads / tenant_id / f"{files_hash}.tar"

    def present(self, tenant_id: str, files_hash: str) -> bool:
        return self._upload(tenant_id, files_hash).exists()

    async def receive(self, tenant_id: str, files_hash: str, chunks: AsyncIterator[bytes]) -> None:
        """One COPY's archive, written beside its place and renamed in when whole."""
        target = self._upload(tenant_id, files_hash)
        target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        partial = target.with_name(f"{target.name}.{uuid.uuid4().hex}.partial")
        size = 0
        try:
            with partial.open("wb") as f:
                async for chunk in chunks:
                    size += len(chunk)
                    if size > MAX_UPLOAD_BYTES:
                        raise PayloadTooLarge(f"an upload holds at most {MAX_UPLOAD_BYTES >> 20} MiB")
                    await asyncio.to_thread(f.write, chunk)
            partial.rename(target)
        finally:
            partial.unlink(missing_ok=True)
        self._trim(target.parent, keep=target)

    @staticmethod
    def _trim(directory: Path, keep: Path) -> None:
        """The oldest uploads dropped until the tenant's are within their cap."""
        files = sorted(directory.glob("*.tar"), key=lambda p: p.stat().st_mtime)
        total = sum(p.stat().st_size for p in files)
        for path in files:
            if total <= MAX_TENANT_UPLOAD_BYTES:
                break
            if path != keep:
                total -= path.stat().st_size
                path.unlink(missing_ok=True)

    # -- running -----------------------------------------------------------------------------------------

    def start(self, job: Job, plan: BuildPlan, parent: tuple[str, ImageConfig] | None) -> None:
        if job.started:
            raise Conflict(f"build {job.id} was started already")
        missing = [h for h in plan.hashes if not self.present(job.tenant_id, h)]
        if missing:
            raise InvalidRequest("steps.filesHash", f"the files of hash {missing[0]} were not uploaded")
        job.started = True
        job.task = asyncio.create_task(self._run(job, plan, parent), name=f"e2b-build-{job.id}")

    async def _run(self, job: Job, plan: BuildPlan, parent: tuple[str, ImageConfig] | None) -> None:
        context: Path | None = None
        try:
            if self.builder is None:
                job.fail(f"building templates is not available here: {self.unavailable}", None)
                return
            async with self._running:
                job.status = "building"
                if plan.python_base and not self.limits.network:
                    job.log(
                        "the python base installs python3 from Debian's archive, and builds here have no network",
                        "warn",
                    )
                if plan.hashes:
                    archives = [self._upload(job.tenant_id, h) for h in plan.hashes]
                    context = await self.builder.stage_context(archives, self.limits)
                built = await self.builder.build(
                    plan.recipe, context=context, parent=parent, limits=self.limits, log=job.log
                )
                await self._name(job, built.digest, built.config)
                job.log(f"template {job.name} is image {built.digest}")
                job.status = "ready"
        except BuildFailed as exc:
            job.fail(exc.message, _step_name(exc), exc.output)
        except asyncio.CancelledError:
            job.fail("the build was cancelled", None)
            raise
        except Exception:
            log.exception("e2b build %s failed", job.id)
            job.fail("the build failed: an error of the builder's own", None)
        finally:
            job.finished_at = time.time()
            if context is not None:
                await asyncio.to_thread(shutil.rmtree, context, True)

    async def _name(self, job: Job, digest: str, config: ImageConfig) -> None:
        """The tenant's template now names the new image (a rebuild replaces the old record)."""
        name = names.owned(job.tenant_id, job.name)
        record = TemplateRecord(
            name=name,
            cpus=job.sizes.cpus,
            memory_mb=job.sizes.memory_mb,
            description=f"built with E2B's Template SDK (build {job.id})",
            image=digest,
            image_config=config,
            disk_mb=job.sizes.disk_mb,
        )
        async with self._names.setdefault(name, asyncio.Lock()):
            store = self.plane.store
            if await store.get_template(name) is not None:
                await store.delete_template(name)
            await self.plane.create_template(record)
            self.plane.templates.forget(name)

    async def close(self) -> None:
        tasks = [j.task for j in self.jobs.values() if j.task is not None and not j.task.done()]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task


def local_builds(
    plane: ControlPlane, root: Path, *, bases_dir: Path | None = None, network: bool = False
) -> E2BBuilds:
    """The builds of a replica on this machine (``corral serve``): layers and uploads under ``root``,
    base tarballs under ``bases_dir`` (made with mmdebstrap on first use when missing), images into the
    replica's blob store. Refused builds (with the reason) when this machine cannot build."""
    from corral.images.bases import Bases

    limits = build_limits(network=network)
    uploads = root / "uploads"
    reason = unavailable_reason()
    blobs = plane.images.blobs
    if reason is None and blobs is None:
        reason = "this control plane keeps no images"
    if reason is not None or blobs is None:
        return E2BBuilds(plane, None, uploads, limits, unavailable=reason)
    builder = Builder(root, blobs, Bases(bases_dir or root / "bases"))
    return E2BBuilds(plane, builder, uploads, limits)
