"""The embedded store: SQLite in WAL mode, one file, nothing to install.

Writes take ``BEGIN IMMEDIATE`` (the database's single write lock, so the capacity check and the
insert of a reservation cannot interleave with another writer's), readers never block on writers
(WAL), and a busy timeout makes writers from several processes queue rather than fail.

Each connection lives on a thread of its own, and a whole transaction runs there in one hop: the shared
transaction code (:mod:`corral.store.sql`) is written against an async ``Tx``, but this backend's
``Tx`` never suspends, so the coroutine is driven to completion on the connection's thread. The event
loop is never blocked (not even while waiting for another process's write lock), a transaction costs
one thread hop instead of one per statement, and because a connection's thread runs one job at a time,
its transactions can never interleave.

``synchronous=NORMAL`` in WAL mode: a committed transaction survives a crash of the process; a power
loss can lose the last few commits but never corrupts the database.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from corral.core.clock import Clock
from corral.store import rows
from corral.store.contract import InvalidRecord, StoreError, StoreUnavailable
from corral.store.migrations import LATEST, MIGRATIONS, statements
from corral.store.sql import Params, SqlStore, Tx

T = TypeVar("T")

MEMORY = ":memory:"


class _SqliteTx:
    """Statements on a connection, run on the caller's thread: the awaits below never suspend."""

    __slots__ = ("_conn",)

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    async def fetchone(self, sql: str, params: Params | None = None) -> rows.Row | None:
        row: rows.Row | None = self._conn.execute(sql, params or {}).fetchone()
        return row

    async def fetchall(self, sql: str, params: Params | None = None) -> list[rows.Row]:
        return self._conn.execute(sql, params or {}).fetchall()

    async def execute(self, sql: str, params: Params | None = None) -> int:
        return self._conn.execute(sql, params or {}).rowcount

    async def executemany(self, sql: str, params: Sequence[Params]) -> None:
        self._conn.executemany(sql, params)


def _drive(work: Awaitable[T]) -> T:
    """Run a coroutine that never suspends to its end, here and now."""
    if not isinstance(work, Coroutine):
        raise TypeError(f"expected a coroutine, got {type(work).__name__}")
    try:
        work.send(None)
    except StopIteration as done:
        result: T = done.value
        return result
    work.close()
    raise RuntimeError("a store transaction awaited something other than its connection")


class _Connection:
    """One sqlite3 connection and the one thread it is used on."""

    def __init__(self, path: str, busy_timeout_s: float, wal: bool) -> None:
        self._executor: ThreadPoolExecutor | None = None
        self._path = path
        self._busy_timeout_s = busy_timeout_s
        self._wal = wal
        self._conn: sqlite3.Connection | None = None

    async def run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="corral-sqlite")
        return await asyncio.get_running_loop().run_in_executor(self._executor, self._call, fn)

    def _call(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        if self._conn is None:
            self._conn = self._open()
        return fn(self._conn)

    def _open(self) -> sqlite3.Connection:
        conn = sqlite3.connect(
            self._path, isolation_level=None, timeout=self._busy_timeout_s, check_same_thread=False
        )
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(self._busy_timeout_s * 1000)}")
            if self._wal:
                self._enable_wal(conn)
            conn.execute("PRAGMA synchronous = NORMAL")
        except BaseException:
            conn.close()
            raise
        return conn

    def _enable_wal(self, conn: sqlite3.Connection) -> None:
        # Switching to WAL needs a moment of exclusive access; a process starting next to busy ones
        # retries rather than failing (the busy handler does not cover this pragma).
        deadline = time.monotonic() + self._busy_timeout_s
        while True:
            try:
                conn.execute("PRAGMA journal_mode = WAL")
                return
            except sqlite3.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.01)

    async def close(self) -> None:
        """Close the connection and stop its thread; a later ``run`` opens both again."""
        executor, self._executor = self._executor, None
        if executor is None:
            return

        def shut() -> None:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

        await asyncio.get_running_loop().run_in_executor(executor, shut)
        executor.shutdown(wait=False)


def _translate(exc: sqlite3.Error) -> StoreError:
    text = str(exc)
    if "no such table" in text:
        return StoreError(f"the store's schema is missing (run migrate first): {text}")
    return StoreUnavailable(f"sqlite: {text}")


def _write_tx(fn: Callable[[Tx], Awaitable[T]]) -> Callable[[sqlite3.Connection], T]:
    def job(conn: sqlite3.Connection) -> T:
        conn.execute("BEGIN IMMEDIATE")
        try:
            result = _drive(fn(_SqliteTx(conn)))
            conn.execute("COMMIT")
            return result
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise

    return job


def _read_tx(fn: Callable[[Tx], Awaitable[T]]) -> Callable[[sqlite3.Connection], T]:
    def job(conn: sqlite3.Connection) -> T:
        conn.execute("BEGIN")  # one snapshot for every statement of the read
        try:
            return _drive(fn(_SqliteTx(conn)))
        finally:
            if conn.in_transaction:
                conn.execute("ROLLBACK")

    return job


class SqliteStore(SqlStore):
    dialect = "sqlite"

    def __init__(self, path: str, *, clock: Clock | None = None, busy_timeout_s: float = 30.0) -> None:
        super().__init__(clock)
        self.path = path
        self.busy_timeout_s = busy_timeout_s
        wal = path != MEMORY
        self._writer = _Connection(path, busy_timeout_s, wal)
        # One process's private in-memory database has only the one connection.
        self._reader = _Connection(path, busy_timeout_s, wal) if wal else self._writer

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

    async def close(self) -> None:
        await self._writer.close()
        if self._reader is not self._writer:
            await self._reader.close()

    # -- transactions --------------------------------------------------------------------------

    async def _write(self, fn: Callable[[Tx], Awaitable[T]]) -> T:
        try:
            return await self._writer.run(_write_tx(fn))
        except sqlite3.IntegrityError:
            raise
        except sqlite3.Error as exc:
            raise _translate(exc) from exc

    async def _read(self, fn: Callable[[Tx], Awaitable[T]]) -> T:
        try:
            return await self._reader.run(_read_tx(fn))
        except sqlite3.Error as exc:
            raise _translate(exc) from exc

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
