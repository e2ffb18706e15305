"""SQLite's group commit: every caller gets an answer, and an answer means committed."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from corral.store import StoreUnavailable, TemplateRecord
from corral.store.sqlite import SqliteStore


async def test_writes_of_one_loop_turn_share_a_commit_and_each_fails_alone(tmp_path: Path) -> None:
    store = SqliteStore(str(tmp_path / "g.db"))
    await store.migrate()
    try:
        commits = store._commits
        results = await asyncio.gather(
            store.renew_replica("r1", 10),
            store.create_template(TemplateRecord("default", 1.0, 512)),  # exists: fails alone
            store.renew_replica("r2", 10),
            return_exceptions=True,
        )
        assert isinstance(results[1], Exception) and not isinstance(results[0], Exception)
        assert store._commits == commits + 1
        # both renewals committed, the failed insert left nothing behind
        assert await store.expire_replicas() == []
        assert {t.name for t in await store.list_templates()} == {"default"}
    finally:
        await store.close()


async def test_a_failure_that_ends_the_whole_transaction_answers_every_caller(tmp_path: Path) -> None:
    store = SqliteStore(str(tmp_path / "full.db"))
    await store.migrate()
    await store.renew_replica("r0", 10)
    assert store._writer is not None
    pages = store._writer.execute("PRAGMA page_count").fetchone()[0]
    store._writer.execute(f"PRAGMA max_page_count = {pages + 2}")  # the disk is about to be full
    try:
        # A row of a table without triggers: a statement that fires one (the change feed's) fails
        # alone, in its statement journal, and leaves the transaction whole.
        big = "x" * 2_000_000
        tasks = [
            asyncio.create_task(store.renew_replica("r1", 10)),
            asyncio.create_task(store.create_tenant(big, max_sandboxes=1, max_memory_mb=1)),
            asyncio.create_task(store.renew_replica("r2", 10)),
        ]
        _, pending = await asyncio.wait(tasks, timeout=10)
        assert not pending, "every caller must get an answer"
        # the renewals had run, but their transaction did not survive: they must not report success
        for t in tasks:
            with pytest.raises(StoreUnavailable):
                t.result()
        store._writer.execute("PRAGMA max_page_count = 1073741823")
        await store.renew_replica("r3", 10)  # and the store goes on
        ids = {r[0] for r in store._writer.execute("SELECT id FROM replicas").fetchall()}
        assert ids == {"r0", "r3"}
    finally:
        await store.close()


async def test_the_log_starts_over_under_writes_that_never_pause(tmp_path: Path) -> None:
    """A checkpoint that only copies what it can never catches up with a writer that keeps
    appending: the log would never start over, its file growing for as long as the load lasted.
    Each checkpoint must also restart it."""
    path = tmp_path / "wal.db"
    store = SqliteStore(str(path), checkpoint_every=10)
    await store.migrate()
    try:
        # Writes one after another, never pausing, until ten checkpoints have been done beside them
        # (however long a checkpoint's disk sync takes on this machine).
        writes = 0
        while store.checkpoints < 10 and writes < 500_000:
            await store.renew_replica(f"r{writes % 50}", 10)
            writes += 1
        assert store.checkpoints >= 10
        # The log's header counts the times it started over (its checkpoint sequence number).
        header = Path(f"{path}-wal").read_bytes()[:16]
        restarts = int.from_bytes(header[12:16], "big")
        assert restarts >= 5, f"the log started over {restarts} times in {writes} commits and 10 checkpoints"
    finally:
        await store.close()
