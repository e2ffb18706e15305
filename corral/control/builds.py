"""Template builds on this replica: the one service behind both build APIs (E2B's Template SDK,
corral.api.e2b.builds, and corral's own, corral.api.templates).

A build is requested for a template name, runs in :class:`~corral.images.builder.Builder`'s build
sandboxes (a recipe's steps, or an imported archive) while its log lines collect here, can be
cancelled, and on success names the template after the new image as its next version: sandboxes
keep the image they started on, and the old image is collected once none uses it (images/gc.py).

What it holds is this replica's memory: a build is polled on the replica that runs it (one for
``corral serve``). Builds run one or two at a time per replica and a tenant has a few at once.
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
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from corral.control.errors import Conflict, PayloadTooLarge, TooManyConcurrent
from corral.control.plane import ControlPlane
from corral.images import registry
from corral.images.builder import Builder, BuildFailed, BuildLimits, Built
from corral.images.config import ImageConfig
from corral.images.recipe import Recipe
from corral.store import NameConflict, TemplateRecord

log = logging.getLogger("corral.control.builds")

MAX_OPEN_BUILDS = 4  # a tenant's builds requested or running at once
MAX_RUNNING = 2  # builds running at once on this replica
MAX_LOG_LINES = 20_000
KEEP_S = 3600.0  # a finished build (or one requested and never started) is forgotten after this
_PUBLISH_TRIES = 5  # builds of one template on other replicas publishing at the same moment
HOST_CA_FILE = "/etc/ssl/certs/ca-certificates.crt"
LEVELS = ("debug", "info", "warn", "error")


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


def iso(ts: float) -> str:
    return datetime.datetime.fromtimestamp(ts, datetime.UTC).isoformat().replace("+00:00", "Z")


@dataclass(frozen=True, slots=True)
class Sizes:
    """What the template's sandboxes get."""

    cpus: float = 1.0
    memory_mb: int = 512
    disk_mb: int | None = None


# What a started build does: its steps (or an import), given the job to log to.
Work = Callable[["Job"], Awaitable[Built]]


@dataclass
class Job:
    id: str
    tenant_id: str
    name: str  # as its API names the template (E2B's templateID, corral's template name)
    template: str  # the template record it names on success
    sizes: Sizes
    created_at: float
    description: str = ""
    status: str = "waiting"  # waiting (requested), building, ready, error
    logs: list[dict[str, Any]] = field(default_factory=list)
    failure: BuildFailed | None = None
    cancelled: bool = False
    started: bool = False
    finished_at: float | None = None
    digest: str | None = None
    version: int | None = None
    task: asyncio.Task[None] | None = None
    # A build that waits for an input (its context archive) before it starts: its work, given that.
    awaiting: Callable[[Path], Work] | None = None

    def log(self, message: str, level: str = "info") -> None:
        if len(self.logs) < MAX_LOG_LINES:
            self.logs.append({"timestamp": iso(time.time()), "level": level, "message": message})
        elif len(self.logs) == MAX_LOG_LINES:
            self.logs.append({"timestamp": iso(time.time()), "level": "warn", "message": "(log cut here)"})

    def fail(self, failure: BuildFailed) -> None:
        self.log(failure.message, "error")
        self.failure = failure
        self.status = "error"

    def entries(self, offset: int, limit: int, level: str | None = None) -> list[dict[str, Any]]:
        """Its log lines from ``offset`` (at most ``limit``), those below ``level`` left out."""
        entries = self.logs[offset : offset + limit]
        if level is not None:
            entries = [e for e in entries if LEVELS.index(e["level"]) >= LEVELS.index(level)]
        return entries


class BuildService:
    """``builder`` None: this replica does not build (``unavailable`` says why)."""

    def __init__(
        self,
        plane: ControlPlane,
        builder: Builder | None,
        root: Path,
        limits: BuildLimits,
        *,
        unavailable: str | None = None,
    ) -> None:
        self.plane = plane
        self.builder = builder
        self.root = root
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

    def request(
        self, tenant_id: str, name: str, template: str, sizes: Sizes, *, description: str = ""
    ) -> Job:
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
        job = Job(
            id=str(uuid.uuid4()),
            tenant_id=tenant_id,
            name=name,
            template=template,
            sizes=sizes,
            created_at=time.time(),
            description=description,
        )
        self.jobs[job.id] = job
        return job

    def job(self, tenant_id: str, name: str, build_id: str) -> Job | None:
        job = self.jobs.get(build_id)
        return job if job is not None and job.tenant_id == tenant_id and job.name == name else None

    def has_open(self, tenant_id: str, name: str) -> bool:
        """Whether the tenant has a build of ``name`` not finished yet (files go to one of those)."""
        return any(
            j.tenant_id == tenant_id and j.name == name and j.finished_at is None for j in self.jobs.values()
        )

    # -- uploads -----------------------------------------------------------------------------------------

    @staticmethod
    async def receive(target: Path, chunks: AsyncIterator[bytes], limit: int) -> None:
        """An upload of at most ``limit`` bytes, written beside ``target`` and renamed in when whole."""
        target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        partial = target.with_name(f"{target.name}.{uuid.uuid4().hex}.partial")
        size = 0
        try:
            with partial.open("wb") as f:
                async for chunk in chunks:
                    size += len(chunk)
                    if size > limit:
                        raise PayloadTooLarge(f"an upload holds at most {limit >> 20} MiB")
                    await asyncio.to_thread(f.write, chunk)
            partial.rename(target)
        finally:
            partial.unlink(missing_ok=True)

    async def start_after_upload(
        self, job: Job, target: Path, chunks: AsyncIterator[bytes], limit: int, work: Callable[[Path], Work]
    ) -> None:
        """Receive ``job``'s input archive into ``target``, then start ``work`` of it (the archive removed
        once it has ended); an upload that fails ends the build as cancelled."""
        try:
            await self.receive(target, chunks, limit)
        except BaseException:
            await self.cancel(job)
            raise
        self.start(job, work(target), cleanup=target)

    # -- running -----------------------------------------------------------------------------------------

    def start(self, job: Job, work: Work, *, cleanup: Path | None = None) -> None:
        """Run ``work`` for ``job`` (``cleanup``: a file or directory removed once it has ended)."""
        if job.started:
            raise Conflict(f"build {job.id} was started already")
        job.started = True
        job.task = asyncio.create_task(self._run(job, work, cleanup), name=f"template-build-{job.id}")

    async def _run(self, job: Job, work: Work, cleanup: Path | None) -> None:
        try:
            if self.builder is None:
                job.fail(
                    BuildFailed("refused", f"building templates is not available here: {self.unavailable}")
                )
                return
            async with self._running:
                job.status = "building"
                built = await work(job)
                await self._name(job, built)
                job.log(f"template {job.name} is image {built.digest} (version {job.version})")
                job.status = "ready"
        except BuildFailed as exc:
            job.fail(exc)
        except asyncio.CancelledError:
            job.fail(BuildFailed("cancelled", "the build was cancelled"))
            if not job.cancelled:  # the replica is stopping: the task ends as cancelled
                raise
        except Exception:
            log.exception("template build %s failed", job.id)
            job.fail(BuildFailed("builder", "the build failed: an error of the builder's own"))
        finally:
            job.finished_at = time.time()
            if cleanup is not None:
                await asyncio.to_thread(_remove, cleanup)

    def recipe_work(
        self, recipe: Recipe, parent: tuple[str, ImageConfig] | None, archives: list[Path]
    ) -> Work:
        """A recipe's build: its context staged from ``archives`` (applied in order; none, no
        context), its steps run, its image packed; the staged context removed after."""

        async def work(job: Job) -> Built:
            builder = self.builder
            assert builder is not None
            context = await builder.stage_context(archives, self.limits) if archives else None
            try:
                return await builder.build(
                    recipe, context=context, parent=parent, limits=self.limits, log=job.log
                )
            finally:
                if context is not None:
                    await asyncio.to_thread(shutil.rmtree, context, True)

        return work

    def import_work(self, archive: Path) -> Work:
        """An image archive's import (OCI layout, ``docker save`` or a rootfs tarball)."""

        async def work(job: Job) -> Built:
            assert self.builder is not None
            return await self.builder.import_archive(archive, limits=self.limits, log=job.log)

        return work

    async def cancel(self, job: Job, wait_s: float = 30.0) -> None:
        """Stop a build (its build sandbox killed) and wait up to ``wait_s`` for it to end; a finished
        one is left as it ended."""
        if job.finished_at is not None:
            return
        job.cancelled = True
        task = job.task
        if task is not None:
            task.cancel()
            await asyncio.wait({task}, timeout=wait_s)
        if job.finished_at is None and (task is None or task.done()):
            # Never started, or cancelled before its first step ran: it ends here.
            job.fail(BuildFailed("cancelled", "the build was cancelled"))
            job.finished_at = time.time()

    async def _name(self, job: Job, built: Built) -> None:
        """The template now names the new image as its next version. A rebuild replaces the record in
        one write and keeps what the build does not set (runtime, stateful, pids, failover); a build
        on another replica that published first makes this one the version after it."""
        name = job.template
        store = self.plane.store
        self.plane.config.check_memory(job.sizes.memory_mb)
        async with self._names.setdefault(name, asyncio.Lock()):
            for _ in range(_PUBLISH_TRIES):
                # Version 0 stands for "none yet": the first build publishes version 1.
                old = await store.get_template(name) or TemplateRecord(name, 1.0, 1, version=0)
                record = replace(
                    old,
                    cpus=job.sizes.cpus,
                    memory_mb=job.sizes.memory_mb,
                    disk_mb=job.sizes.disk_mb,
                    image=built.digest,
                    image_config=built.config,
                    description=job.description or old.description,
                    version=old.version + 1,
                )
                try:
                    await store.publish_template(record)
                except NameConflict:
                    continue
                self.plane.templates.forget(name)
                job.digest, job.version = built.digest, record.version
                return
        raise BuildFailed("builder", f"template {name!r} kept changing while this build published it")

    async def close(self) -> None:
        tasks = [j.task for j in self.jobs.values() if j.task is not None and not j.task.done()]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task


def _remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def local_builds(
    plane: ControlPlane, root: Path, *, bases_dir: Path | None = None, network: bool = False
) -> BuildService:
    """The builds of a replica on this machine (``corral serve``): layers and uploads under ``root``,
    base tarballs under ``bases_dir`` (made with mmdebstrap on first use when missing), images into the
    replica's blob store. Refused builds (with the reason) when this machine cannot build."""
    from corral.images.bases import Bases

    limits = build_limits(network=network)
    reason = unavailable_reason()
    blobs = plane.images.blobs
    if reason is None and blobs is None:
        reason = "this control plane keeps no images"
    if reason is not None or blobs is None:
        return BuildService(plane, None, root, limits, unavailable=reason)
    pull = registry.pull if registry.unavailable_reason() is None else None
    builder = Builder(root, blobs, Bases(bases_dir or root / "bases"), pull=pull)
    return BuildService(plane, builder, root, limits)
