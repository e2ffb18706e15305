"""When the state of record cannot be reached, the store says ``StoreUnavailable`` (never a raw driver
error), and it recovers by itself when the database is back."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import psycopg
import pytest

from corral.store import StoreUnavailable, open_store
from corral.store.sqlite import SqliteStore

from .conftest import with_schema
from .helpers import hosts


@pytest.mark.postgres
async def test_unreachable_postgres_is_store_unavailable() -> None:
    # Port 9 on loopback: nothing listens there, so the connection is refused at once.
    store = open_store("postgresql://postgres@127.0.0.1:9/test?pool_timeout=0.5&connect_timeout=1")
    try:
        with pytest.raises(StoreUnavailable) as e:
            await store.ping()
        assert e.value.code == "store_unavailable"
        with pytest.raises(StoreUnavailable):
            await store.reserve("h", memory_mb=1, owner="r", ttl_s=1)
        with pytest.raises(StoreUnavailable):
            await store.migrate()
    finally:
        await store.close()


@pytest.mark.postgres
async def test_postgres_recovers_after_its_connections_are_cut(pg_server: str, pg_schema: str) -> None:
    app = f"corral_{pg_schema}"
    store = open_store(with_schema(pg_server, pg_schema) + f"&application_name={app}&pool_size=2")
    try:
        await store.migrate()
        await hosts(store, 1)
        # The server drops every connection of this store (as a restart or failover would).
        with psycopg.connect(pg_server, autocommit=True) as admin:
            cut = admin.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = %s",
                [app],
            ).fetchone()
        assert cut is not None and cut[0] >= 1
        # Reads ride over the dropped connection; a write may fail once (as StoreUnavailable, never a raw
        # driver error), and the next one goes through on a fresh connection.
        assert [h.id for h in await store.list_hosts()] == ["h00"]
        outcomes = []
        for _ in range(3):
            try:
                outcomes.append(await store.reserve("h00", memory_mb=1, owner="r", ttl_s=5) is not None)
                break
            except StoreUnavailable:
                outcomes.append(False)
        assert outcomes[-1] is True
        await store.ping()
    finally:
        await store.close()


async def test_sqlite_in_a_missing_directory_is_store_unavailable(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'no' / 'such' / 'dir.db'}")
    try:
        with pytest.raises(StoreUnavailable):
            await store.migrate()
        with pytest.raises(StoreUnavailable):
            await store.ping()
    finally:
        await store.close()


async def test_sqlite_write_lock_held_too_long_is_store_unavailable_then_recovers(tmp_path: Path) -> None:
    path = tmp_path / "corral.db"
    store = SqliteStore(str(path), busy_timeout_s=0.2)
    try:
        await store.migrate()
        await hosts(store, 1)
        other = sqlite3.connect(path, isolation_level=None)
        other.execute("BEGIN IMMEDIATE")  # another process holds the write lock
        try:
            with pytest.raises(StoreUnavailable):
                await store.reserve("h00", memory_mb=1, owner="r", ttl_s=5)
            # Reads do not wait for writers (WAL).
            assert len(await store.list_hosts()) == 1
        finally:
            other.execute("ROLLBACK")
            other.close()
        assert await store.reserve("h00", memory_mb=1, owner="r", ttl_s=5) is not None
        assert await store.audit() == []
    finally:
        await store.close()
