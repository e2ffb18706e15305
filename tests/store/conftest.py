"""Store fixtures: one contract suite, parametrised over SQLite and PostgreSQL.

PostgreSQL comes from ``CORRAL_TEST_POSTGRES_URL`` (default ``postgresql://postgres@127.0.0.1:5432/test``).
Each test gets its own schema under a per-session prefix, dropped afterwards, so concurrent runs on one
server never collide. Without a server the PostgreSQL cases skip with a message; under ``CI=true`` they
fail instead.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from corral.core import ManualClock
from corral.store import Store, open_store

DEFAULT_PG = "postgresql://postgres@127.0.0.1:5432/test"
BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
T0 = 1_000_000.0


def pg_base_url() -> str:
    return os.environ.get("CORRAL_TEST_POSTGRES_URL", DEFAULT_PG)


def with_schema(url: str, schema: str) -> str:
    return f"{url}{'&' if '?' in url else '?'}schema={schema}"


def drop_schema(url: str, schema: str) -> None:
    with psycopg.connect(url, autocommit=True, connect_timeout=5) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


@pytest.fixture(scope="session")
def pg_server() -> str:
    """The PostgreSQL base URL, once it is known to answer."""
    url = pg_base_url()
    try:
        with psycopg.connect(url, connect_timeout=3) as conn:
            conn.execute("SELECT 1")
    except psycopg.Error as exc:
        message = f"PostgreSQL not reachable at {url} (set CORRAL_TEST_POSTGRES_URL): {exc}"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message + " -- under CI the PostgreSQL tests must run", pytrace=False)
        pytest.skip(message)
    return url


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


@pytest.fixture
async def store(store_url: str, clock: ManualClock) -> AsyncIterator[Store]:
    s = open_store(store_url, clock=clock)
    await s.migrate()
    try:
        yield s
    finally:
        await s.close()
