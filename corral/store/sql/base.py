"""What every aggregate of the SQL store shares: the transaction seam, the helpers more than one
aggregate uses, and the module-level rules."""

from __future__ import annotations

import hashlib
from abc import abstractmethod
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from typing import Any, ClassVar, Protocol, TypeVar

from corral.clock import SystemClock
from corral.core.clock import Clock
from corral.jsontext import dumps_sorted
from corral.store import rows
from corral.store.contract import Store
from corral.store.errors import NameConflict
from corral.store.fit import fit_condition, room_order
from corral.store.migrations import DIALECTS, LATEST, MIGRATIONS, statements
from corral.store.records import (
    HostRecord,
    ReservationRecord,
    SandboxRecord,
    SandboxState,
)
from corral.store.rows import in_list

T = TypeVar("T")
R = TypeVar("R")
Params = Mapping[str, Any]


_FITS = fit_condition()
_ROOM_ORDER = room_order()
# ``state`` in a form no index serves: where a narrower index exists (expiry, tenant, host), the state
# index (nearly every sandbox is running) must not be the planner's choice.
UNINDEXED_STATE = "(state || '')"
# The condition of the partial state index (migration 12), written as a query must repeat it for the
# planner to use the index.
NOT_RUNNING = f"state <> '{SandboxState.RUNNING.value}'"
_TOKEN_PREFIX = "crl_"


class Tx(Protocol):
    """One open transaction. SQL uses ``:name`` placeholders; the backend translates."""

    async def fetchone(self, sql: str, params: Params | None = None) -> rows.Row | None: ...

    async def fetchall(self, sql: str, params: Params | None = None) -> list[rows.Row]: ...

    async def execute(self, sql: str, params: Params | None = None) -> int:
        """Run a statement; returns the number of rows it changed."""
        ...

    async def executemany(self, sql: str, params: Sequence[Params]) -> None: ...


class _NoRoom(Exception):
    """Raised inside a write transaction to roll back an all-or-nothing batch."""


def token_hash(plaintext: str) -> str:
    # Tokens are 256 random bits: a fast hash is enough (nothing to brute-force), and lets the store
    # look a token up by its hash without keeping the plaintext.
    return hashlib.sha256(plaintext.encode()).hexdigest()


class SqlBase(Store):
    dialect: ClassVar[str]
    # Appended to a SELECT that must lock the rows it reads (empty where the transaction already
    # holds the whole database, as SQLite's BEGIN IMMEDIATE does).
    for_update: ClassVar[str] = ""

    def __init__(self, clock: Clock | None = None) -> None:
        self.clock: Clock = clock if clock is not None else SystemClock()

    @abstractmethod
    async def _write(self, fn: Callable[[Tx], Awaitable[T]]) -> T:
        """Run ``fn`` in one write transaction; roll back if it raises."""

    @abstractmethod
    async def _read(self, fn: Callable[[Tx], Awaitable[T]]) -> T:
        """Run ``fn`` against a consistent read."""

    @abstractmethod
    def _is_unique_violation(self, exc: BaseException) -> bool: ...

    async def _write_unique(self, fn: Callable[[Tx], Awaitable[T]], taken: str) -> T:
        """``_write(fn)``, with a unique-key violation raised as :class:`NameConflict` saying ``taken``."""
        try:
            return await self._write(fn)
        except Exception as exc:
            if self._is_unique_violation(exc):
                raise NameConflict(taken) from exc
            raise

    async def _read_one(self, sql: str, params: Params, from_row: Callable[[rows.Row], R]) -> R | None:
        """The one row ``sql`` selects, made into a record; None where it selects none."""

        async def run(tx: Tx) -> R | None:
            row = await tx.fetchone(sql, params)
            return from_row(row) if row is not None else None

        return await self._read(run)

    def _now(self) -> float:
        return self.clock.now()

    async def _apply_migrations(self, tx: Tx, ddl: Callable[[str], Awaitable[object]], now: float) -> int:
        """Apply, in ``tx``, every migration not yet applied, each recorded as applied at ``now``;
        ``ddl`` runs one statement as written (no parameters). Returns the schema's version."""
        await ddl(
            "CREATE TABLE IF NOT EXISTS schema_migrations "
            f"(version INTEGER PRIMARY KEY, applied_at {DIALECTS[self.dialect]['real']} NOT NULL)"
        )
        have = {int(r[0]) for r in await tx.fetchall("SELECT version FROM schema_migrations")}
        for m in MIGRATIONS:
            if m.version in have:
                continue
            for stmt in statements(m, self.dialect):
                await ddl(stmt)
            await tx.execute("INSERT INTO schema_migrations VALUES (:v, :now)", {"v": m.version, "now": now})
        return LATEST

    async def ping(self) -> None:
        await self._read(lambda tx: tx.fetchone("SELECT 1"))

    async def _host(self, tx: Tx, host_id: str, now: float) -> HostRecord | None:
        sql = rows.HOSTS_SELECT.format(scope="AND host_id = :id") + " WHERE h.id = :id"
        row = await tx.fetchone(sql, {"now": now, "id": host_id})
        return rows.host_from_row(row) if row is not None else None

    async def _lock_hosts(self, tx: Tx, host_ids: Collection[str]) -> None:
        """Take the row locks of ``host_ids`` in id order (no-op where the transaction already holds
        the database)."""
        if not self.for_update or not host_ids:
            return
        clause, params = in_list("l", sorted(host_ids))
        await tx.fetchall(f"SELECT id FROM hosts WHERE id IN {clause} ORDER BY id{self.for_update}", params)

    async def _end_where(self, tx: Tx, where: str, params: Params) -> int:
        """End every reservation matching ``where``: delete the rows and take their amounts off
        their hosts' counters, in this transaction. Returns how many ended; each row is deleted (so
        ended) by exactly one transaction, which is the one that subtracts it."""
        hosts = [
            r[0]
            for r in await tx.fetchall(f"SELECT DISTINCT host_id FROM reservations WHERE {where}", params)
        ]
        if not hosts:
            return 0
        await self._lock_hosts(tx, hosts)
        clause, hp = in_list("eh", hosts)
        gone = await tx.fetchall(
            f"DELETE FROM reservations WHERE ({where}) AND host_id IN {clause} RETURNING host_id, memory_mb, cpu_m",
            {**params, **hp},
        )
        await self._subtract(tx, gone)
        return len(gone)

    async def _subtract(self, tx: Tx, gone: Sequence[rows.Row]) -> None:
        per_host: dict[str, list[int]] = {}
        for host_id, mb, cpu_m in gone:
            t = per_host.setdefault(host_id, [0, 0])
            t[0] += int(mb)
            t[1] += int(cpu_m)
        if per_host:
            await tx.executemany(
                "UPDATE hosts SET reserved_mb = reserved_mb - :mb, reserved_cpu_m = reserved_cpu_m - :cpu "
                "WHERE id = :id",
                [{"id": h, "mb": mb, "cpu": cpu} for h, (mb, cpu) in sorted(per_host.items())],
            )

    async def _sandbox(self, tx: Tx, sandbox_id: str) -> SandboxRecord | None:
        row = await tx.fetchone(
            f"SELECT {rows.SANDBOX_COLS} FROM sandboxes WHERE id = :id", {"id": sandbox_id}
        )
        return rows.sandbox_from_row(row) if row is not None else None


_POOLS_WITH_TARGETS = f"SELECT {rows.POOL_COLS} FROM pools {{where}} ORDER BY template"


def _with_host(r: ReservationRecord, host_id: str) -> ReservationRecord:
    return ReservationRecord(
        r.id, host_id, r.memory_mb, r.cpu, r.owner, r.sandbox_id, r.created_at, r.expires_at
    )


def _json(metadata: Mapping[str, str]) -> str:
    return dumps_sorted(dict(metadata)) if metadata else "{}"
