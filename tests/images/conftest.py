"""Fixtures of the images tests: blob stores, every backend behind :class:`~corral.images.blobs.BlobStore`
(the directory and PostgreSQL, a schema of its own per test, dropped afterwards; without a server the
PostgreSQL cases skip, and fail under ``CI=true``); and one builder root per test session, the small
base unpacked into it once and its layers reused by every test's builds (each test gets its own
Builder over it, bound to its own event loop)."""

from __future__ import annotations

import io
import shutil
import tarfile
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from corral.api.app import create_app
from corral.control.builds import BuildService, build_limits, unavailable_reason
from corral.images import BlobStore, DirBlobStore, registry
from corral.images.bases import Bases
from corral.images.builder import Builder
from corral.store import open_store
from corral.store.blobs import PostgresBlobStore
from corral.store.postgres import PostgresStore
from corral.testing.images import small_base
from tests.ci import require
from tests.control.conftest import ADMIN, Cluster, make_cluster
from tests.pg import drop_schema, new_schema_name, require_pg, with_schema

BLOB_BACKENDS = ["dir", pytest.param("postgres", marks=pytest.mark.postgres)]

# Opens one more blob store on the same backend and data (a second replica): ``await opener()``.
Opener = Callable[[], Any]


@pytest.fixture
def pg_url() -> Iterator[str]:
    base = require_pg()
    schema = new_schema_name("corral_blobs")
    try:
        yield with_schema(base, schema)
    finally:
        drop_schema(base, schema)


@pytest.fixture(params=BLOB_BACKENDS)
async def replicas(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Opener]:
    """Opens blob stores over one backend's data, as many replicas would."""
    async with AsyncExitStack() as stack:
        if request.param == "dir":

            async def open_dir() -> BlobStore:
                return DirBlobStore(tmp_path / "blobs")

            yield open_dir
        else:
            url = request.getfixturevalue("pg_url")

            async def open_pg() -> BlobStore:
                store = open_store(url)
                assert isinstance(store, PostgresStore)
                stack.push_async_callback(store.close)
                await store.migrate()
                return PostgresBlobStore(store, chunk=64 << 10)

            yield open_pg


@pytest.fixture
async def blobs(replicas: Opener) -> BlobStore:
    store: BlobStore = await replicas()
    return store


def _unavailable() -> str | None:
    """What building needs (the control plane's own check), and mmdebstrap for the small base."""
    if shutil.which("mmdebstrap") is None:
        return "mmdebstrap is missing: `make system-deps` installs it"
    return unavailable_reason()


@pytest.fixture(scope="session")
def builder_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    require(_unavailable())
    return tmp_path_factory.mktemp("builder")


@pytest.fixture
def builder(builder_root: Path) -> Builder:
    return Builder(
        builder_root,
        DirBlobStore(builder_root / "blobs"),
        Bases(builder_root / "bases", {"debian:bookworm": small_base()}),
    )


# -- a control plane that builds, over its HTTP API (test_template_api.py, test_registry.py) ----------


@dataclass
class Api:
    c: Cluster
    http: httpx.AsyncClient
    admin: dict[str, str]
    tenant: dict[str, str]
    tenant_id: str
    service: BuildService

    async def build(self, name: str, recipe: str, context: bytes | None = None) -> dict[str, Any]:
        """Start a build (its context uploaded when given); its answer."""
        body = {"recipe": recipe, "context": context is not None}
        r = await self.http.post(f"/v1/templates/{name}/builds", json=body, headers=self.admin)
        assert r.status_code == 202, r.text
        if context is None:
            return dict(r.json())
        r = await self.http.put(
            f"/v1/templates/{name}/builds/{r.json()['id']}/context", content=context, headers=self.admin
        )
        assert r.status_code == 202, r.text
        return dict(r.json())

    async def wait(self, name: str, build: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
        """The build once it has ended, and its whole log."""
        logs, offset = list(build["logs"]), build["next_offset"]
        while True:
            r = await self.http.get(
                f"/v1/templates/{name}/builds/{build['id']}",
                params={"offset": offset, "wait_s": 5},
                headers=self.admin,
            )
            assert r.status_code == 200, r.text
            got = r.json()
            logs += got["logs"]
            offset = got["next_offset"]
            if got["status"] in ("ready", "error"):
                return got, logs

    async def templates(self, headers: dict[str, str] | None = None) -> dict[str, dict[str, Any]]:
        r = await self.http.get("/v1/templates", headers=headers or self.admin)
        assert r.status_code == 200, r.text
        return {t["name"]: t for t in r.json()["templates"]}

    async def create(self, template: str) -> httpx.Response:
        return await self.http.post("/v1/sandboxes", json={"template": template}, headers=self.admin)

    async def run(self, sandbox_id: str, command: str) -> str:
        r = await self.http.post(
            f"/v1/sandboxes/{sandbox_id}/exec", json={"command": command}, headers=self.admin
        )
        assert r.status_code == 200, r.text
        return str(r.json()["stdout"])


@pytest.fixture
async def api(tmp_path: Path, builder_root: Path) -> AsyncIterator[Api]:
    c = await make_cluster(tmp_path, hosts=1, memory_mb=4096, cpus=2.0, runtime="process")
    blobs = c.plane.images.blobs
    assert isinstance(blobs, DirBlobStore)
    bases = Bases(builder_root / "bases", {"debian:bookworm": small_base()})
    pull = registry.pull if registry.unavailable_reason() is None else None
    builder = Builder(builder_root, blobs, bases, pull=pull)
    service = BuildService(c.plane, builder, tmp_path / "builds", build_limits(network=False, timeout_s=120))
    app = create_app(c.plane, manage=False, builds=service)
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://corral.test")
    admin = c.as_(ADMIN)
    r = await http.post("/v1/tenants", json={"name": "alice"}, headers=admin)
    assert r.status_code == 201, r.text
    try:
        yield Api(c, http, admin, c.as_(r.json()["token"]), r.json()["id"], service)
    finally:
        await service.close()
        await http.aclose()
        await c.fleet.stop(stop_sandboxes=True)
        await c.close()


def tar_of(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()
