"""reserve_best under row contention on PostgreSQL: a candidate whose host row another writer holds is
passed over for the best free one, never queued behind. Queued writers all decided from the snapshot
taken before the lock was released, so they all landed on the host that looked roomiest then: a burst
over four replicas once put twelve creates on one host of twelve."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator

import psycopg
import pytest

from corral.store import Store, open_store
from tests.pg import with_schema

from .helpers import hosts

pytestmark = pytest.mark.postgres


@pytest.fixture
async def pg_store(pg_server: str, pg_schema: str) -> AsyncIterator[Store]:
    s = open_store(with_schema(pg_server, pg_schema))
    await s.migrate()
    try:
        yield s
    finally:
        await s.close()


async def _hold(pg_server: str, schema: str, host_ids: list[str]) -> psycopg.AsyncConnection:
    """An open transaction holding the row locks of ``host_ids``, as a writer in flight does."""
    conn = await psycopg.AsyncConnection.connect(pg_server)
    await conn.execute(f'SET search_path TO "{schema}"')
    await conn.execute("SELECT id FROM hosts WHERE id = ANY(%s) FOR UPDATE", (host_ids,))
    return conn


async def test_a_locked_best_candidate_is_passed_over(
    pg_store: Store, pg_server: str, pg_schema: str
) -> None:
    await hosts(pg_store, 2, admittable=5000)
    assert await pg_store.reserve("h01", memory_mb=1000, owner="other", ttl_s=60)  # h00 has the most room
    holder = await _hold(pg_server, pg_schema, ["h00"])
    try:
        got = await asyncio.wait_for(
            pg_store.reserve_best(["h00", "h01"], memory_mb=500, owner="r", ttl_s=60), timeout=10
        )
        assert got is not None and got.host_id == "h01"
    finally:
        await holder.rollback()
        await holder.close()
    assert await pg_store.audit() == []


async def test_all_candidates_locked_waits_then_takes_the_best(
    pg_store: Store, pg_server: str, pg_schema: str
) -> None:
    await hosts(pg_store, 2, admittable=5000)
    assert await pg_store.reserve("h01", memory_mb=1000, owner="other", ttl_s=60)
    holder = await _hold(pg_server, pg_schema, ["h00", "h01"])
    task = asyncio.create_task(pg_store.reserve_best(["h00", "h01"], memory_mb=500, owner="r", ttl_s=60))
    await asyncio.sleep(0.2)
    assert not task.done()  # nothing free to take: it waits for the rows rather than refusing
    await holder.rollback()
    await holder.close()
    got = await asyncio.wait_for(task, timeout=30)
    assert got is not None and got.host_id == "h00"
    assert await pg_store.audit() == []


async def test_a_concurrent_burst_from_four_stores_spreads(
    pg_store: Store, pg_server: str, pg_schema: str
) -> None:
    ids = await hosts(pg_store, 12, admittable=6144)
    others = [open_store(with_schema(pg_server, pg_schema)) for _ in range(3)]
    stores = [pg_store, *others]
    try:
        # Every create offers all twelve hosts: the roomiest free one must win each time.
        got = await asyncio.gather(
            *(
                stores[k % 4].reserve_best(ids, memory_mb=512, cpu=1.0, owner=f"r{k % 4}", ttl_s=60)
                for k in range(48)
            )
        )
    finally:
        for s in others:
            await s.close()
    per_host = Counter(r.host_id for r in got if r is not None)
    assert sum(per_host.values()) == 48
    # Twelve full hosts' worth of 512 MiB: 4 each when spread, 12 on one when writers queue.
    assert max(per_host.values()) <= 5, per_host
    assert await pg_store.audit() == []
