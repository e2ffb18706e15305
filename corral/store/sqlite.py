"""The embedded store: SQLite in WAL mode, one file, nothing to install.

Writes take ``BEGIN IMMEDIATE`` (the database's single write lock, so the capacity check and the
insert of a reservation cannot interleave with another writer's); readers never block on writers
(WAL). A transaction runs inline on the event loop with a zero busy timeout, so it either gets the
lock at once or learns at once that another process has it; only then does it move to its
connection's thread, which waits there while the loop goes on. The writes of one loop turn share one
commit (group commit), each in a savepoint of its own. Checkpoints run on a thread of their own.

``synchronous=NORMAL`` in WAL mode: a committed transaction survives a crash of the process; a power
loss can lose the last few commits but never corrupts the database.

The log is kept bounded under writes that never pause: a checkpoint that only copies what it can
(PASSIVE) never catches up with a writer that keeps appending, so the log would never start over and
its file would grow for as long as the load lasts. Each checkpoint therefore copies the bulk without
blocking anyone, then briefly holds writers back to copy the rest and restart the log (RESTART).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sqlite3
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from corral.core.clock import Clock
from corral.store import rows
from corral.store.errors import InvalidRecord, StoreError, StoreUnavailable
from corral.store.sql import Params, SqlStore, Tx

T = TypeVar("T")

MEMORY = ":memory:"
CHECKPOINT_EVERY = 250
# How long the restarting checkpoint may hold writers back waiting for a reader; past it, the log
# starts over at a later checkpoint instead.
RESTART_WAIT_MS = 50
# The log's file is cut back to this after it starts over (it keeps its largest size otherwise).
WAL_KEEP_BYTES = 64 * 1024 * 1024
# SQLite's own default page cache is 2 MiB, less than the indexes a fleet of sandboxes touches.
CACHE_KIB = 64 * 1024
MMAP_BYTES = 256 * 1024 * 1024
log = logging.getLogger("corral.store.sqlite")


_NO_PARAMS: Params = {}


class _SqliteTx:
    """A transaction on a plain sqlite3 connection, through one cursor for all its statements (a
    connection's ``execute`` makes a cursor per statement, half the cost of a short one).

    Its methods are coroutines that never suspend, so the shared async SQL core drives a whole
    transaction in one call (:func:`_drive`), with no event-loop turn while the write lock is held.
    """

    __slots__ = ("_cur",)

    def __init__(self, cur: sqlite3.Cursor) -> None:
        self._cur = cur

    async def fetchone(self, sql: str, params: Params | None = None) -> rows.Row | None:
        row: rows.Row | None = self._cur.execute(sql, params or _NO_PARAMS).fetchone()
        return row

    async def fetchall(self, sql: str, params: Params | None = None) -> list[rows.Row]:
        return self._cur.execute(sql, params or _NO_PARAMS).fetchall()

    async def execute(self, sql: str, params: Params | None = None) -> int:
        return self._cur.execute(sql, params or _NO_PARAMS).rowcount

    async def executemany(self, sql: str, params: Sequence[Params]) -> None:
        self._cur.executemany(sql, params)


_Pending = tuple[Callable[[Tx], Awaitable[Any]], "asyncio.Future[Any]"]
_Outcome = tuple[bool, Any]


def _deliver(batch: list[_Pending], outcomes: list[_Outcome]) -> None:
    for (_, fut), (ok, value) in zip(batch, outcomes, strict=True):
        if fut.done():
            continue
        if ok:
            fut.set_result(value)
        else:
            fut.set_exception(value)


def _busy(exc: sqlite3.OperationalError) -> bool:
    return "locked" in str(exc) or "busy" in str(exc)


def _drive(coro: Awaitable[T]) -> T:
    """Run a coroutine that never suspends to completion, synchronously."""
    assert isinstance(coro, Coroutine)
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    coro.close()
    raise RuntimeError("a store transaction awaited something other than its own statements")


def _unavailable(exc: sqlite3.Error) -> StoreError:
    text = str(exc)
    if "no such table" in text:
        return StoreError(f"the store's schema is missing (run migrate first): {text}")
    return StoreUnavailable(f"sqlite: {text}")


class SqliteStore(SqlStore):
    dialect = "sqlite"

    def __init__(
        self,
        path: str,
        *,
        clock: Clock | None = None,
        busy_timeout_s: float = 30.0,
        checkpoint_every: int = CHECKPOINT_EVERY,
    ) -> None:
        super().__init__(clock)
        self.path = path
        self.busy_timeout_s = busy_timeout_s
        self.checkpoint_every = checkpoint_every
        self._writer: sqlite3.Connection | None = None
        self._reader: sqlite3.Connection | None = None
        # One thread per connection: every statement of a connection runs on its thread.
        self._write_thread: ThreadPoolExecutor | None = None
        self._read_thread: ThreadPoolExecutor | None = None
        self._open_lock = asyncio.Lock()
        self._write_lock = asyncio.Lock()
        self._read_lock = asyncio.Lock()
        self._commits = 0
        self._queue: list[_Pending] = []
        self._flusher: asyncio.Task[None] | None = None
        self._checkpoint_thread: ThreadPoolExecutor | None = None
        self._checkpoint_conn: sqlite3.Connection | None = None
        self._checkpointing: asyncio.Future[None] | None = None
        self.checkpoints = 0  # checkpoints done since the store opened
        # Told after each committed batch: one process owns the file, so its own commits are every
        # change there is.
        self._wakes: set[Callable[[], None]] = set()

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

    def _private(self) -> None:
        """The database holds token hashes and host keys: owner-only. SQLite gives its -wal and -shm
        files the database file's mode, so creating (or tightening) that one covers all three.

        An existing file is never opened here: POSIX record locks belong to the process, so closing
        any descriptor of the database drops the shared lock this process's connections hold on it,
        and another process's last connection to close would then delete the log still in use here."""
        try:
            os.close(os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600))
        except FileExistsError:
            pass
        except OSError:
            return  # sqlite3 itself then says why it cannot open it, as the store's own error
        for suffix in ("", "-wal", "-shm"):
            with contextlib.suppress(FileNotFoundError):
                os.chmod(self.path + suffix, 0o600)

    def _connect(self) -> sqlite3.Connection:
        if not self.in_memory:
            self._private()
        conn = sqlite3.connect(
            self.path, isolation_level=None, timeout=self.busy_timeout_s, check_same_thread=False
        )
        try:
            if not self.in_memory:
                self._wal(conn)
            conn.execute("PRAGMA synchronous = NORMAL")
            conn.execute(f"PRAGMA cache_size = -{CACHE_KIB}")
            if not self.in_memory:
                conn.execute(f"PRAGMA mmap_size = {MMAP_BYTES}")
                conn.execute(f"PRAGMA journal_size_limit = {WAL_KEEP_BYTES}")
            # Statements run on the event loop must never wait for a lock (see "transactions").
            conn.execute("PRAGMA busy_timeout = 0")
            # Checkpoints (copying the log back into the database, with an fsync) run on a thread of
            # their own, never inside a commit on the event loop (see ``_checkpoint_soon``).
            conn.execute("PRAGMA wal_autocheckpoint = 0")
        except BaseException:
            conn.close()
            raise
        return conn

    def _wal(self, conn: sqlite3.Connection) -> None:
        # Switching to WAL needs a moment of exclusive access; a process starting next to busy ones
        # retries rather than failing (the busy handler does not cover this pragma).
        deadline = time.monotonic() + self.busy_timeout_s
        while True:
            try:
                conn.execute("PRAGMA journal_mode = WAL")
                return
            except sqlite3.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.01)

    async def _open(self) -> None:
        if self._writer is not None:
            return
        async with self._open_lock:
            if self._writer is not None:
                return
            loop = asyncio.get_running_loop()
            wt = ThreadPoolExecutor(1, thread_name_prefix="corral-sqlite-w")
            rt = wt if self.in_memory else ThreadPoolExecutor(1, thread_name_prefix="corral-sqlite-r")
            try:
                writer = await loop.run_in_executor(wt, self._connect)
                # One process's private in-memory database has only the one connection.
                reader = writer if self.in_memory else await loop.run_in_executor(rt, self._connect)
            except sqlite3.Error as exc:
                wt.shutdown(wait=False)
                rt.shutdown(wait=False)
                raise _unavailable(exc) from exc
            self._write_thread, self._read_thread = wt, rt
            self._writer, self._reader = writer, reader

    async def close(self) -> None:
        if self._flusher is not None and not self._flusher.done():
            with contextlib.suppress(Exception):
                await self._flusher
        if self._checkpointing is not None:
            with contextlib.suppress(Exception):
                await self._checkpointing
        ckpt, self._checkpoint_thread = self._checkpoint_thread, None
        if ckpt is not None:
            conn, self._checkpoint_conn = self._checkpoint_conn, None
            if conn is not None:
                await asyncio.get_running_loop().run_in_executor(ckpt, conn.close)
            ckpt.shutdown(wait=True)
        writer, reader = self._writer, self._reader
        if writer is not None and not self.in_memory:
            # Leave the database whole in its main file: the log folded in and truncated.
            with contextlib.suppress(sqlite3.Error):
                writer.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        wt, rt = self._write_thread, self._read_thread
        self._writer = self._reader = None
        self._write_thread = self._read_thread = None
        loop = asyncio.get_running_loop()
        if reader is not None and reader is not writer and rt is not None:
            await loop.run_in_executor(rt, reader.close)
        if writer is not None and wt is not None:
            await loop.run_in_executor(wt, writer.close)
        for thread in {id(t): t for t in (wt, rt) if t is not None}.values():
            thread.shutdown(wait=True)

    # -- transactions --------------------------------------------------------------------------
    #
    # A transaction first runs inline, on the event loop: the connection's busy timeout is zero, so
    # taking the write lock either succeeds at once or fails at once, and a transaction of a few
    # statements on a local file costs less than the hop to a thread would. Only when another
    # process holds the lock does the transaction move to the connection's thread, which waits for
    # it there (busy timeout) while the loop goes on: the loop never waits on another writer.

    async def _write(self, fn: Callable[[Tx], Awaitable[T]]) -> T:
        # Group commit: the writes that arrive in one turn of the event loop share one BEGIN ... COMMIT,
        # each in a savepoint of its own, so one write's failure rolls back that write alone. Callers
        # learn their outcome only after the COMMIT.
        await self._open()
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Any] = loop.create_future()
        self._queue.append((fn, fut))
        if self._flusher is None or self._flusher.done():
            self._flusher = loop.create_task(self._flush())
        result: T = await fut
        return result

    async def _flush(self) -> None:
        await asyncio.sleep(0)  # let the writers of this turn of the loop join the batch
        while self._queue:
            batch, self._queue = self._queue, []
            try:
                async with self._write_lock:
                    _deliver(batch, await self._commit_batch(batch))
            finally:
                # Whatever happened above, no caller is left waiting for an answer that never comes.
                _deliver(
                    batch, [(False, StoreUnavailable("sqlite: the write was not committed"))] * len(batch)
                )
            self._checkpoint_soon()
            for wake in list(self._wakes):
                wake()

    async def _commit_batch(self, batch: list[_Pending]) -> list[_Outcome]:
        conn = self._writer
        if conn is None:
            return [(False, StoreUnavailable("sqlite: the store is closed"))] * len(batch)
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            if not (isinstance(exc, sqlite3.OperationalError) and _busy(exc)):
                return [(False, _unavailable(exc))] * len(batch)
            assert self._write_thread is not None
            return await asyncio.get_running_loop().run_in_executor(
                self._write_thread, self._run_batch_waiting, conn, batch
            )
        return self._run_batch(conn, batch)

    def _run_batch_waiting(self, conn: sqlite3.Connection, batch: list[_Pending]) -> list[_Outcome]:
        """On the writer's thread: wait for another process's write lock, then run the batch."""
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout_s * 1000)}")
            try:
                conn.execute("BEGIN IMMEDIATE")
            finally:
                conn.execute("PRAGMA busy_timeout = 0")
        except sqlite3.Error as exc:
            return [(False, _unavailable(exc))] * len(batch)
        return self._run_batch(conn, batch)

    def _run_batch(self, conn: sqlite3.Connection, batch: list[_Pending]) -> list[_Outcome]:
        """Run each write in its own savepoint of the open transaction, then commit them together.

        Some failures (disk full, I/O error) roll back the whole transaction, not just one statement:
        then every write of the batch, including those that had succeeded, is reported unavailable.
        """
        outcomes: list[_Outcome] = []
        cur = conn.cursor()
        tx = _SqliteTx(cur)
        try:
            for fn, fut in batch:
                if fut.cancelled():
                    outcomes.append((False, asyncio.CancelledError()))  # its caller is gone: do nothing
                    continue
                cur.execute("SAVEPOINT w")
                try:
                    outcomes.append((True, _drive(fn(tx))))
                except Exception as exc:
                    if not conn.in_transaction:
                        raise  # the whole transaction is gone with it
                    cur.execute("ROLLBACK TO w")
                    failed = exc
                    if isinstance(exc, sqlite3.Error) and not isinstance(exc, sqlite3.IntegrityError):
                        failed = _unavailable(exc)
                    outcomes.append((False, failed))
                cur.execute("RELEASE w")
            cur.execute("COMMIT")
        except Exception as exc:
            with contextlib.suppress(sqlite3.Error):
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
            gone = _unavailable(exc) if isinstance(exc, sqlite3.Error) else StoreUnavailable(f"sqlite: {exc}")
            return [(False, gone)] * len(batch)
        self._commits += 1
        return outcomes

    def _checkpoint_soon(self) -> None:
        """Every ``checkpoint_every`` commits, copy the log back into the database on the checkpoint
        thread and start it over, so the log stays small (see the module's notes)."""
        if self.in_memory or self._commits < self.checkpoint_every or self._checkpointing is not None:
            return
        if self._checkpoint_thread is None:
            self._checkpoint_thread = ThreadPoolExecutor(1, thread_name_prefix="corral-sqlite-ckpt")
        self._commits = 0
        fut = asyncio.get_running_loop().run_in_executor(self._checkpoint_thread, self._checkpoint)
        self._checkpointing = fut
        fut.add_done_callback(self._checkpointed)

    def _checkpointed(self, fut: asyncio.Future[None]) -> None:
        self._checkpointing = None
        if not fut.cancelled() and fut.exception() is not None:
            log.warning("sqlite checkpoint failed: %s", fut.exception())
        elif not fut.cancelled():
            self.checkpoints += 1

    def _checkpoint(self) -> None:
        conn = self._checkpoint_conn
        if conn is None:
            conn = self._checkpoint_conn = self._connect()
        conn.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout_s * 1000)}")
        conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
        # What was appended meanwhile is little: writers wait for it (on their connection's thread,
        # never on the event loop), and the next write starts the log from its beginning.
        conn.execute(f"PRAGMA busy_timeout = {RESTART_WAIT_MS}")
        conn.execute("PRAGMA wal_checkpoint(RESTART)")

    async def _read(self, fn: Callable[[Tx], Awaitable[T]]) -> T:
        await self._open()
        async with self._write_lock if self.in_memory else self._read_lock:
            conn = self._reader
            if conn is None:
                raise StoreUnavailable("sqlite: the store is closed")
            try:
                return self._run_read(conn, fn)
            except StoreUnavailable as exc:
                if not isinstance(exc.__cause__, sqlite3.OperationalError) or not _busy(exc.__cause__):
                    raise
            # A WAL reader is only ever busy for a moment (another process recovering the log):
            # wait for it on the reader's thread.
            assert self._read_thread is not None
            return await asyncio.get_running_loop().run_in_executor(
                self._read_thread, self._run_read_waiting, conn, fn
            )

    def _run_read_waiting(self, conn: sqlite3.Connection, fn: Callable[[Tx], Awaitable[T]]) -> T:
        conn.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout_s * 1000)}")
        try:
            return self._run_read(conn, fn)
        finally:
            conn.execute("PRAGMA busy_timeout = 0")

    @staticmethod
    def _run_read(conn: sqlite3.Connection, fn: Callable[[Tx], Awaitable[T]]) -> T:
        try:
            conn.execute("BEGIN")
            try:
                return _drive(fn(_SqliteTx(conn.cursor())))
            finally:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
        except sqlite3.Error as exc:
            raise _unavailable(exc) from exc

    def _is_unique_violation(self, exc: BaseException) -> bool:
        return isinstance(exc, sqlite3.IntegrityError) and "UNIQUE" in str(exc)

    def on_change(self, wake: Callable[[], None]) -> Callable[[], None]:
        self._wakes.add(wake)
        return lambda: self._wakes.discard(wake)

    # -- lifecycle -----------------------------------------------------------------------------

    async def migrate(self) -> int:
        now = self._now()
        return await self._write(lambda tx: self._apply_migrations(tx, tx.execute, now))
