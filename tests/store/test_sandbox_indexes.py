"""The sandbox indexes by state and by host hold only the records their reads look for (records not
running; records with a host): every create's move from reserved to running would otherwise rewrite
entries in both. The reads must still find their records through them, not by reading every sandbox."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from corral.core import ManualClock
from corral.store import NameConflict, SandboxState, Store
from corral.store.sqlite import SqliteStore

from .helpers import hosts, sandbox


async def _fleet(store: Store) -> None:
    tenant = await store.create_tenant("t", max_sandboxes=1000, max_memory_mb=1 << 30)
    (h,) = await hosts(store, 1)
    for i in range(40):
        await store.create_sandbox(sandbox(f"sb-r{i:03d}", tenant, state=SandboxState.RESERVED))
    for i in range(40):
        sid = f"sb-x{i:03d}"
        await store.create_sandbox(sandbox(sid, tenant, state=SandboxState.RESERVED))
        await store.set_sandbox_state(sid, SandboxState.RUNNING, expect=SandboxState.RESERVED, host_id=h)


async def test_the_state_and_host_reads_find_every_record_they_ask_for(store: Store) -> None:
    await _fleet(store)

    async def ids(**kw: object) -> set[str]:
        page = await store.list_sandboxes(limit=100, **kw)  # type: ignore[arg-type]
        return {s.id for s in page.items}

    assert await ids(state=SandboxState.RESERVED) == {f"sb-r{i:03d}" for i in range(40)}
    assert await ids(state=SandboxState.RUNNING) == {f"sb-x{i:03d}" for i in range(40)}
    assert len(await ids(state=[SandboxState.RUNNING, SandboxState.RESERVED])) == 80
    assert await ids(host_id="h00") == {f"sb-x{i:03d}" for i in range(40)}
    assert await ids(host_id="h00", state=SandboxState.RESERVED) == set()


def _plans(path: Path, statements: list[str]) -> dict[str, str]:
    with sqlite3.connect(path) as conn:
        defs = dict(conn.execute("SELECT name, sql FROM sqlite_master WHERE type = 'index'").fetchall())
        assert "WHERE state <> 'running'" in defs["sandboxes_state_page"]
        assert "WHERE host_id IS NOT NULL" in defs["sandboxes_host_page"]
        assert "WHERE name IS NOT NULL AND state <> 'deleted'" in defs["sandboxes_tenant_name"]
        return {
            sql: " / ".join(row[-1] for row in conn.execute(f"EXPLAIN QUERY PLAN {sql}"))
            for sql in statements
        }


async def test_sqlite_reads_by_state_and_by_host_go_through_their_partial_indexes(tmp_path: Path) -> None:
    path = tmp_path / "ix.db"
    store = SqliteStore(str(path), clock=ManualClock(1_000.0))
    await store.migrate()
    try:
        await _fleet(store)
        assert store._reader is not None
        seen: list[str] = []
        store._reader.set_trace_callback(seen.append)
        await store.list_sandboxes(state=[SandboxState.RESERVED, SandboxState.ORPHANED])
        await store.list_sandboxes(host_id="h00")
        await store.list_sandboxes(state=SandboxState.RUNNING)
        tenant = await store.get_tenant_by_name("t")
        assert tenant is not None
        await store.list_sandbox_summaries(tenant_id=tenant.id, after=(1_000.0, "sb-r010"))
    finally:
        await store.close()
    reads = [s for s in seen if s.startswith("SELECT") and "FROM sandboxes" in s]
    assert len(reads) == 4
    plans = list(_plans(path, reads).values())
    assert "sandboxes_state_page" in plans[0], plans[0]
    assert "sandboxes_host_page" in plans[1], plans[1]
    # running is most of a fleet: read in creation order, not through the state index
    assert "sandboxes_state_page" not in plans[2] and "TEMP B-TREE" not in plans[2], plans[2]
    # a namespace's summaries: its tenant's rows in listing order, from where the last page ended
    assert "sandboxes_tenant_page" in plans[3] and "TEMP B-TREE" not in plans[3], plans[3]


async def test_a_live_name_stays_unique_in_its_tenant_through_an_index_of_named_sandboxes_only(
    tmp_path: Path,
) -> None:
    path = tmp_path / "names.db"
    store = SqliteStore(str(path), clock=ManualClock(1_000.0))
    await store.migrate()
    try:
        tenant = await store.create_tenant("t", max_sandboxes=100, max_memory_mb=1 << 30)
        other = await store.create_tenant("u", max_sandboxes=100, max_memory_mb=1 << 30)
        for i in range(20):
            await store.create_sandbox(sandbox(f"sb-n{i:03d}", tenant))
        await store.create_sandbox(sandbox("sb-web", tenant, name="web"))
        with pytest.raises(NameConflict):
            await store.create_sandbox(sandbox("sb-web2", tenant, name="web"))
        await store.create_sandbox(sandbox("sb-web3", other, name="web"))  # another tenant's: fine
        await store.delete_sandbox("sb-web")
        await store.create_sandbox(sandbox("sb-web4", tenant, name="web"))  # the name is free again
    finally:
        await store.close()
    with sqlite3.connect(path) as conn:
        plan = " / ".join(
            r[-1]
            for r in conn.execute(
                "EXPLAIN QUERY PLAN SELECT id FROM sandboxes WHERE tenant_id = 't' AND name = 'web' "
                "AND state <> 'deleted'"
            )
        )
    assert "sandboxes_tenant_name" in plan, plan
