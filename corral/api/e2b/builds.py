"""E2B's template builds on this replica: the small adapter between E2B's build API (templates.py) and
the replica's build service (:class:`corral.control.builds.BuildService`, which corral's own build API
shares).

A build is requested (``POST /v3/templates``), gets its COPY steps' files uploaded (one tar archive
per files hash, kept per tenant), is started with its steps (translate.py), runs in the builder's
build sandboxes while its log lines collect, and on success names the tenant's template
(``<tenant id>.<name>``, names.py) after the new image: a rebuild makes a new version of the template,
sandboxes keep the image they started on. Its status answers in E2B's words and shape.

The uploads a tenant keeps are capped, the oldest dropped first.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from corral.api.e2b import names
from corral.api.e2b.translate import BuildPlan
from corral.control.builds import BuildService, Job, Sizes, iso
from corral.control.errors import InvalidRequest
from corral.images.builder import BuildFailed
from corral.images.config import ImageConfig

__all__ = ["E2BBuilds", "Sizes"]

MAX_UPLOAD_BYTES = 512 << 20  # one COPY's archive
MAX_TENANT_UPLOAD_BYTES = 2 << 30  # what one tenant's uploads may hold on this replica


def _step_name(exc: BuildFailed) -> str | None:
    """The SDK's name of the step that failed: its index (1-based), ``base`` for the base."""
    if exc.step:
        return str(exc.line) if exc.line else "base"
    return "base" if exc.reason == "refused" else None


def status_json(job: Job, offset: int, limit: int, level: str | None) -> dict[str, Any]:
    """A build's state as E2B's SDK polls it."""
    out: dict[str, Any] = {
        "templateID": job.name,
        "buildID": job.id,
        "status": job.status,
        "logs": [],
        "logEntries": job.entries(offset, limit, level),
    }
    failure = job.failure
    if failure is not None:
        step = _step_name(failure)
        tail = [
            {"timestamp": iso(job.finished_at or job.created_at), "level": "error", "message": line}
            for line in failure.output.strip().splitlines()[-20:]
        ]
        out["reason"] = {"message": failure.message, **({"step": step} if step else {}), "logEntries": tail}
    return out


class E2BBuilds:
    """E2B's builds over the replica's build service."""

    def __init__(self, service: BuildService) -> None:
        self.service = service
        self.uploads = service.root / "uploads"

    def request(self, tenant_id: str, name: str, sizes: Sizes) -> Job:
        return self.service.request(
            tenant_id, name, names.owned(tenant_id, name), sizes, description="built with E2B's Template SDK"
        )

    def job(self, tenant_id: str, name: str, build_id: str) -> Job | None:
        return self.service.job(tenant_id, name, build_id)

    def has_open(self, tenant_id: str, name: str) -> bool:
        return self.service.has_open(tenant_id, name)

    # -- uploads -----------------------------------------------------------------------------------------

    def _upload(self, tenant_id: str, files_hash: str) -> Path:
        return self.uploads / tenant_id / f"{files_hash}.tar"

    def present(self, tenant_id: str, files_hash: str) -> bool:
        return self._upload(tenant_id, files_hash).exists()

    async def receive(self, tenant_id: str, files_hash: str, chunks: AsyncIterator[bytes]) -> None:
        """One COPY's archive."""
        target = self._upload(tenant_id, files_hash)
        await self.service.receive(target, chunks, MAX_UPLOAD_BYTES)
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
        missing = [h for h in plan.hashes if not self.present(job.tenant_id, h)]
        if missing:
            raise InvalidRequest("steps.filesHash", f"the files of hash {missing[0]} were not uploaded")
        if plan.python_base and not self.service.limits.network:
            job.log(
                "the python base installs python3 from Debian's archive, and builds here have no network",
                "warn",
            )
        archives = [self._upload(job.tenant_id, h) for h in plan.hashes]
        self.service.start(job, self.service.recipe_work(plan.recipe, parent, archives))
