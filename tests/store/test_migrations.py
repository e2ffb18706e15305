"""Migrations: versioned, idempotent, safe when several replicas (or processes) start at once."""

from __future__ import annotations

import asyncio
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from corral.core import ManualClock
from corral.store import DEFAULT_MAX_CPUS, InvalidRecord, Listing, StoreError, open_store
from corral.store.migrations import LATEST, MIGRATIONS, statements

from .helpers import beat
from .test_tenants import raw_rows

ALL_VERSIONS = [(m.version,) for m in MIGRATIONS]


async def test_migrate_twice_is_a_no_op(store_url: str, clock: ManualClock) -> None:
    store = open_store(store_url, clock=clock)
    try:
        assert await store.migrate() == LATEST
        assert await store.migrate() == LATEST
        assert [t.name for t in await store.list_templates()] == ["default"]
    finally:
        await store.close()
    assert raw_rows(store_url, "SELECT version FROM schema_migrations ORDER BY version") == ALL_VERSIONS


async def test_concurrent_migrations_in_one_process(store_url: str) -> None:
    stores = [open_store(store_url) for _ in range(4)]
    try:
        assert await asyncio.gather(*(s.migrate() for s in stores)) == [LATEST] * 4
        assert [t.name for t in await stores[0].list_templates()] == ["default"]
    finally:
        for s in stores:
            await s.close()
    assert raw_rows(store_url, "SELECT version FROM schema_migrations ORDER BY version") == ALL_VERSIONS


@pytest.mark.slow
def test_concurrent_migrations_across_processes(store_url: str) -> None:
    code = (
        "import asyncio, sys\n"
        "from corral.store import open_store\n"
        "async def main():\n"
        "    s = open_store(sys.argv[1])\n"
        "    print(await s.migrate())\n"
        "    await s.close()\n"
        "asyncio.run(main())\n"
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, store_url], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for _ in range(4)
    ]
    outs = [p.communicate(timeout=60) for p in procs]
    assert [p.returncode for p in procs] == [0] * 4, [err for _, err in outs]
    assert [out.strip() for out, _ in outs] == [str(LATEST)] * 4
    assert raw_rows(store_url, "SELECT version FROM schema_migrations ORDER BY version") == ALL_VERSIONS
    assert raw_rows(store_url, "SELECT name FROM templates") == [("default",)]


async def test_an_unmigrated_store_says_so(store_url: str) -> None:
    store = open_store(store_url)
    try:
        with pytest.raises(StoreError, match="migrate"):
            await store.list_hosts()
    finally:
        await store.close()


@pytest.mark.parametrize(
    "url",
    [
        "mysql://localhost/db",
        "sqlite:relative.db",
        "sqlite:///",
        "postgresql://localhost/db?schema=Bad-Name",
        "postgresql://localhost/db?pool_size=zero",
        "postgresql://localhost/db?pool_size=0",
    ],
)
def test_bad_urls_are_refused(url: str) -> None:
    with pytest.raises(InvalidRecord) as e:
        open_store(url)
    assert e.value.code == "invalid_request"


async def test_in_memory_sqlite() -> None:
    for url in ("sqlite://:memory:", "sqlite:///:memory:"):
        store = open_store(url)
        try:
            await store.migrate()
            t = await store.create_tenant("x", max_sandboxes=1, max_memory_mb=1)
            assert await store.list_tenants() == [t]
        finally:
            await store.close()


async def test_a_closed_store_opens_again_on_use(store_url: str) -> None:
    store = open_store(store_url)
    try:
        await store.migrate()
        t = await store.create_tenant("x", max_sandboxes=1, max_memory_mb=1)
        await store.close()
        assert await store.get_tenant(t.id) == t
    finally:
        await store.close()


def _migrated_below(path: Path, version: int) -> sqlite3.Connection:
    """A SQLite store as a tree from before migration ``version`` left it."""
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, applied_at REAL NOT NULL)")
    for m in MIGRATIONS:
        if m.version >= version:
            break
        for sql in statements(m, "sqlite"):
            db.execute(sql)
        db.execute("INSERT INTO schema_migrations VALUES (?, 0)", (m.version,))
    return db


async def test_an_upgrade_asks_each_host_for_its_whole_listing(tmp_path: Path) -> None:
    """A store written when hosts' sandbox lists were one JSON value each holds no listing it can trust
    after the upgrade: a heartbeat of changes is not applied, and the agent's next (whole) one is."""
    path = tmp_path / "old.db"
    db = _migrated_below(path, 10)
    db.execute("INSERT INTO hosts (id, registered_at, seq) VALUES ('h-old', 0, 1)")
    db.execute("INSERT INTO host_sandboxes (host_id, sandbox_ids) VALUES ('h-old', ?)", ('["sb-a", "sb-b"]',))
    db.commit()
    db.close()
    store = open_store(f"sqlite:///{path}")
    try:
        assert await store.migrate() == LATEST
        host = await store.get_host("h-old")
        assert host is not None and host.listed_seq is None and host.sandbox_count == 0
        changes = await store.upsert_heartbeat(beat("h-old", 2, listing=Listing(1, {"sb-c": 0})))
        assert changes.accepted and changes.listed_seq is None
        whole = await store.upsert_heartbeat(beat("h-old", 3, sandbox_ids=frozenset({"sb-a", "sb-b"})))
        assert whole.listed_seq == 3 and whole.host.sandbox_count == 2
        assert await store.listed("h-old", ["sb-a", "sb-b", "sb-c"]) == {"sb-a": 0, "sb-b": 0}
    finally:
        await store.close()


async def test_an_upgrade_gives_tenants_a_cpu_quota_and_counts_what_they_hold(tmp_path: Path) -> None:
    """Tenants from before the CPU quota get the default one, raised to what they already hold (none is
    over it at once), and their live sandboxes' CPUs counted: the quota holds from the first create."""
    path = tmp_path / "old.db"
    db = _migrated_below(path, 14)
    sandboxes = [
        ("small", "a", "running", 1.5),
        ("small", "b", "stopped", 4.0),
        ("wide", "c", "running", 1500.0),
    ]
    for tid in ("small", "wide"):
        db.execute(
            "INSERT INTO tenants (id, name, max_sandboxes, max_memory_mb, created_at, live_sandboxes, live_memory_mb) "
            "VALUES (?, ?, 10, 10000, 0, ?, ?)",
            (tid, tid, 1, 512),
        )
    for tid, sid, st, cpus in sandboxes:
        db.execute(
            "INSERT INTO sandboxes (id, tenant_id, template, state, memory_mb, cpus, stateful, created_at, updated_at) "
            "VALUES (?, ?, 'default', ?, 512, ?, 0, 0, 0)",
            (sid, tid, st, cpus),
        )
    db.commit()
    db.close()
    store = open_store(f"sqlite:///{path}")
    try:
        assert await store.migrate() == LATEST
        small, wide = await store.get_tenant("small"), await store.get_tenant("wide")
        assert small is not None and small.max_cpus == DEFAULT_MAX_CPUS
        assert wide is not None and wide.max_cpus == 1500.0
        assert (await store.usage("small")).cpus == 1.5 and (await store.usage("wide")).cpus == 1500.0
        assert await store.audit() == []
    finally:
        await store.close()
