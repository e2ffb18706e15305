"""Fixtures of the images tests: blob stores, every backend behind :class:`~corral.images.blobs.BlobStore`
(the directory and PostgreSQL, a schema of its own per test, dropped afterwards; without a server the
PostgreSQL cases skip, and fail under ``CI=true``); and one builder root per test session, the small
base unpacked into it once and its layers reused by every test's builds (each test gets its own
Builder over it, bound to its own event loop)."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import pytest

from corral.control.builds import unavailable_reason
from corral.images import BlobStore, DirBlobStore
from corral.images.bases import Bases
from corral.images.builder import Builder
from corral.store import open_store
from corral.store.blobs import PostgresBlobStore
from corral.store.postgres import PostgresStore
from corral.testing.images import small_base
from tests.ci import require
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
