"""The embedded store: SQLite in WAL mode, one file, nothing to install.

Writes take ``BEGIN IMMEDIATE`` (the database's single write lock, so the capacity check and the
insert of a reservation cannot interleave with another writer's), readers never block on writers
(WAL), and a busy timeout makes writers from several processes queue rather than fail. Each connection
lives on its own thread (aiosqlite), so a transaction waiting for the lock never blocks the event loop;
within one process an asyncio lock keeps one write transaction open per connection at a time.

``synchronous=NORMAL`` in WAL mode: a committed transaction survives a crash of the process; a power
loss can lose the last few commits but never corrupts the database.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

import aiosqlite

from corral.core.clock import Clock
from corral.store import rows
from corral.store.contract import InvalidRecord, StoreError, StoreUnavailable
from corral.store.migrations import LATEST, MIGRATIONS, statements
from corral.store.sql import Params, SqlStore, Tx

T = TypeVar("T")

MEMORY = ":memory:"


class _SqliteTx:
    __slots__ = ("_conn",)

    def __init__(self, conn: aiosqlite.Connection) -> None:
        self._conn = conn

    async def fetchone(self, sql: str, params: Params | None = None) -> rows.Row | None:
        got = await self._conn.execute_fetchall(sql, params or {})
        for row in got:
            return row
        return None

    async def fetchall(self, sql: str, params: Params | None = None) -> list[rows.Row]:
        return list(await self._conn.execute_fetchall(sql, params or {}))

    async def execute(self, sql: str, params: Params | None = None) -> int:
        cur = await self._conn.execute(sql, params or {})
        n = cur.rowcount
        await cur.close()
        return n

    async def executemany(self, sql: str, params: Sequence[Params]) -> None:
        await self._conn.executemany(sql, params)


def _unavailable(exc: sqlite3.Error) -> StoreError:
    text = str(exc)
    if "no such table" in text:
        return StoreError(f"the store's schema is missing (run migrate first): {text}")
    return StoreUnavailable(f"sqlite: {text}")


def _probe(path: str) -> None:
    sqlite3.connect(path).close()


class SqliteStore(SqlStore):
    dialect = "sqlite"

    def __init__(self, path: str, *, clock: Clock | None = None, busy_timeout_s: float = 30.0) -> None:
        super().__init__(clock)
        self.path = path
        self.busy_timeout_s = busy_timeout_s
        self._writer: aiosqlite.Connection | None = None
        self._reader: aiosqlite.Connection | None = None
        self._open_lock = asyncio.Lock()
        self._write_lock = asyncio.Lock()
        self._read_lock = asyncio.Lock()

    @classmethod
    def from_url(cls, url: str, *, clock: Clock | None = None) -> SqliteStore:
        rest = url.removeprefix("sqlite:")
        if rest in ("", "//", "//:memory:", "///:memory:", ":memory:"):
            return cls(MEMORY, clock=clock)
        if not rest.startswith("///") or len(rest) == 3:
            raise InvalidRecord(
                f"sqlite URL {url!r}: expected sqlite:///path/to/file.db or sqlite://:memory:"
            )
        return cls(rest[3:], clock=clock)

    @property
    def in_memory(self) -> bool:
        return self.path == MEMORY

    # -- connections ---------------------------------------------------------------------------

    async def _connect(self) -> aiosqlite.Connection:
        conn = await aiosqlite.connect(self.path, isolation_level=None, timeout=self.busy_timeout_s)
        try:
            await conn.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout_s * 1000)}")
            if not self.in_memory:
                await self._wal(conn)
            await conn.execute("PRAGMA synchronous = NORMAL")
        except BaseException:
            await conn.close()
            raise
        return conn

    async def _wal(self, conn: aiosqlite.Connection) -> None:
        # Switching to WAL needs a moment of exclusive access; a process starting next to busy ones
        # retries rather than failing (the busy handler does not cover this pragma).
        deadline = time.monotonic() + self.busy_timeout_s
        while True:
            try:
                await conn.execute("PRAGMA journal_mode = WAL")
                return
            except sqlite3.OperationalError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.01)

    async def _open(self) -> tuple[aiosqlite.Connection, aiosqlite.Connection]:
        if self._writer is not None and self._reader is not None:
            return self._writer, self._reader
        async with self._open_lock:
            if self._writer is None:
                try:
                    if not self.in_memory:
                        # Fail here, in our own thread, when the file cannot be opened: aiosqlite's
                        # failed-connect path leaves its worker thread to call into a loop that may
                        # be gone by then.
                        await asyncio.to_thread(_probe, self.path)
                    self._writer = await self._connect()
                    # One process's private in-memory database has only the one connection.
                    self._reader = self._writer if self.in_memory else await self._connect()
                except sqlite3.Error as exc:
                    await self.close()
                    raise _unavailable(exc) from exc
            assert self._writer is not None and self._reader is not None
            return self._writer, self._reader

    async def close(self) -> None:
        writer, reader = self._writer, self._reader
        self._writer = self._reader = None
        for conn in {id(c): c for c in (writer, reader) if c is not None}.values():
            await conn.close()

    # -- transactions --------------------------------------------------------------------------

    async def _write(self, fn: Callable[[Tx], Awaitable[T]]) -> T:
        writer, _ = await self._open()
        async with self._write_lock:
            try:
                await writer.execute("BEGIN IMMEDIATE")
            except sqlite3.Error as exc:
                raise _unavailable(exc) from exc
            try:
                result = await fn(_SqliteTx(writer))
                await writer.execute("COMMIT")
                return result
            except BaseException as exc:
                # Shielded: a cancelled caller must still leave no half-written transaction behind.
                await asyncio.shield(self._rollback(writer))
                if isinstance(exc, sqlite3.Error) and not isinstance(exc, sqlite3.IntegrityError):
                    raise _unavailable(exc) from exc
                raise

    @staticmethod
    async def _rollback(conn: aiosqlite.Connection) -> None:
        if conn.in_transaction:
            await conn.execute("ROLLBACK")

    async def _read(self, fn: Callable[[Tx], Awaitable[T]]) -> T:
        writer, reader = await self._open()
        lock = self._write_lock if reader is writer else self._read_lock
        async with lock:
            try:
                await reader.execute("BEGIN")
                try:
                    return await fn(_SqliteTx(reader))
                finally:
                    await asyncio.shield(self._rollback(reader))
            except sqlite3.Error as exc:
                raise _unavailable(exc) from exc

    def _is_unique_violation(self, exc: BaseException) -> bool:
        return isinstance(exc, sqlite3.IntegrityError) and "UNIQUE" in str(exc)

    # -- lifecycle -----------------------------------------------------------------------------

    async def migrate(self) -> int:
        now = self._now()

        async def run(tx: Tx) -> int:
            await tx.execute(
                "CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, applied_at REAL NOT NULL)"
            )
            have = {int(r[0]) for r in await tx.fetchall("SELECT version FROM schema_migrations")}
            for m in MIGRATIONS:
                if m.version in have:
                    continue
                for stmt in statements(m, self.dialect):
                    await tx.execute(stmt)
                await tx.execute(
                    "INSERT INTO schema_migrations VALUES (:v, :now)", {"v": m.version, "now": now}
                )
            return LATEST

        return await self._write(run)

    async def ping(self) -> None:
        await self._read(lambda tx: tx.fetchone("SELECT 1"))
