"""PostgreSQL for tests: the server from ``CORRAL_TEST_POSTGRES_URL`` and a schema per test, dropped
afterwards. Without a server these tests skip with a message; under ``CI=true`` they fail instead."""

from __future__ import annotations

import os
import secrets

import psycopg
from psycopg import sql

from tests.ci import require

DEFAULT_PG = "postgresql://postgres@127.0.0.1:5432/test"


def pg_base_url() -> str:
    return os.environ.get("CORRAL_TEST_POSTGRES_URL", DEFAULT_PG)


def with_schema(url: str, schema: str) -> str:
    return f"{url}{'&' if '?' in url else '?'}schema={schema}"


def new_schema_name(prefix: str = "corral") -> str:
    return f"{prefix}_{os.getpid()}_{secrets.token_hex(4)}"


def drop_schema(url: str, schema: str) -> None:
    with psycopg.connect(url, autocommit=True, connect_timeout=5) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


def require_pg() -> str:
    """The base URL, once it answers; skip (or, under CI, fail) otherwise."""
    url = pg_base_url()
    try:
        with psycopg.connect(url, connect_timeout=3) as conn:
            conn.execute("SELECT 1")
    except psycopg.Error as exc:
        message = f"PostgreSQL not reachable at {url} (set CORRAL_TEST_POSTGRES_URL): {exc}"
        require(message, " -- under CI the PostgreSQL tests must run")
    return url
