"""Store fixtures: one contract suite, parametrised over SQLite and PostgreSQL.

PostgreSQL comes from ``CORRAL_TEST_POSTGRES_URL`` (default ``postgresql://postgres@127.0.0.1:5432/test``).
Each test gets its own schema under a per-session prefix, dropped afterwards, so concurrent runs on one
server never collide. Without a server the PostgreSQL cases skip with a message; under ``CI=true`` they
fail instead.
"""

from __future__ import annotations

import os
import random
import secrets
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from corral.core import ManualClock
from corral.store import Store, open_store
from corral.testing.store import ModelStore
from tests.pg import drop_schema, require_pg, with_schema

BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
T0 = 1_000_000.0


@pytest.fixture(scope="session")
def pg_server() -> str:
    """The PostgreSQL base URL, once it is known to answer."""
    return require_pg()


@pytest.fixture(scope="session")
def schema_prefix() -> str:
    return f"corral_t{os.getpid()}_{secrets.token_hex(3)}"


@pytest.fixture
def pg_schema(pg_server: str, schema_prefix: str) -> Iterator[str]:
    """A fresh, uniquely named schema for one test; dropped afterwards."""
    schema = f"{schema_prefix}_{secrets.token_hex(4)}"
    try:
        yield schema
    finally:
        drop_schema(pg_server, schema)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(T0)


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def store_url(backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A URL naming an empty, unmigrated store of ``backend``."""
    if backend == "sqlite":
        return f"sqlite:///{tmp_path / 'corral.db'}"
    pg_server = request.getfixturevalue("pg_server")
    return with_schema(pg_server, request.getfixturevalue("pg_schema"))


@pytest.fixture(params=["sql", "model"])
def either(request: pytest.FixtureRequest, store: Store, clock: ManualClock) -> Store:
    """The SQL store of this case, or the model the simulator and the tests' doubles run on."""
    return store if request.param == "sql" else ModelStore(clock, random.Random(0))


@pytest.fixture
async def store(store_url: str, clock: ManualClock) -> AsyncIterator[Store]:
    s = open_store(store_url, clock=clock)
    await s.migrate()
    try:
        yield s
    finally:
        await s.close()
