"""One SQLite file shared by processes (a ``corral serve`` and an operator's command or a test beside
it): each process's writes stay visible to the others, whatever one of them opens and closes.

SQLite's last connection to close deletes the log (-wal, -shm) when it can take an exclusive lock on
the database file; every other process's connections hold a shared lock there to stop it. POSIX record
locks belong to a process, not to a descriptor: closing any descriptor of the database file in the
server's process drops that shared lock, and the next process to close a connection deletes the log
the server goes on writing to, its writes from then on seen by no other process."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

from corral.store import TemplateRecord
from corral.store.sqlite import SqliteStore

_OTHER = (
    "import sqlite3, sys; c = sqlite3.connect(sys.argv[1]); "
    "print(c.execute(sys.argv[2]).fetchall()); c.commit(); c.close()"
)


def _other_process(db: Path, sql: str = "SELECT name FROM templates ORDER BY name") -> str:
    """What a connection of another process reads (or writes), opened and closed there."""
    return subprocess.run(
        [sys.executable, "-c", _OTHER, str(db), sql], check=True, capture_output=True, text=True
    ).stdout


def _log(db: Path) -> tuple[int, int]:
    return os.stat(f"{db}-wal").st_ino, os.stat(f"{db}-shm").st_ino


async def test_another_process_closing_never_deletes_the_log_a_store_is_writing(tmp_path: Path) -> None:
    db = tmp_path / "shared.db"
    store = SqliteStore(str(db), checkpoint_every=1)  # a checkpoint (and its connection) every commit
    await store.migrate()
    try:
        for n in range(3):
            await store.create_template(TemplateRecord(f"t{n}", 1.0, 256))
            for _ in range(500):  # the checkpoint runs on its own thread
                if store.checkpoints > n:
                    break
                await asyncio.sleep(0.01)
            log = _log(db)
            assert f"t{n}" in _other_process(db)  # opened, read, closed: never the last one out
            assert _log(db) == log, "another process deleted the log this store writes to"
        # Both ways: a row another process writes is read here, one written here is read there.
        _other_process(
            db,
            "INSERT INTO templates (name, cpus, memory_mb, stateful, created_at) "
            "VALUES ('theirs', 1.0, 256, 0, 0)",
        )
        assert await store.get_template("theirs") is not None
        await store.create_template(TemplateRecord("ours", 1.0, 256))
        assert "ours" in _other_process(db)
    finally:
        await store.close()
