"""The fleet store: PostgreSQL through psycopg 3 and a connection pool.

The hot paths are single statements in autocommit: a reservation is one conditional
``UPDATE hosts ... WHERE memory_mb_admittable - reserved_mb >= charge`` chained to its ``INSERT`` in a
CTE. Under READ COMMITTED, a concurrent UPDATE of the same host row makes PostgreSQL wait and re-check
the condition against the newest row version, so two replicas can never both take the last room: no
table locks, no SERIALIZABLE retries. Multi-row writes lock host rows in id order (see
:mod:`corral.store.sql`); a deadlock or serialisation failure that slips through is retried.

Every "cannot reach the server" error (refused, pool timeout, connection lost) surfaces as
:class:`StoreUnavailable`, and makes the breaker (:mod:`corral.store.outage`) probe the server on a
fresh connection. If the probe fails too, every later call fails at once instead of each waiting out a
connection attempt, and the probe watches for the server's return, then starts a fresh pool so no call
inherits a connection the outage killed.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import re
from collections.abc import Awaitable, Callable, Sequence
from functools import lru_cache
from typing import Any, TypeVar
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import psycopg
import psycopg.errors
from psycopg import sql as pgsql
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from corral.core.clock import Clock
from corral.store import rows
from corral.store.errors import InvalidRecord, StoreError, StoreUnavailable
from corral.store.fit import by_tie_rank, fit_condition, image_pattern, room_order
from corral.store.outage import Breaker
from corral.store.records import ReservationRecord
from corral.store.sql import Params, SqlStore, Tx

T = TypeVar("T")

_SCHEMA_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
_PLACEHOLDER = re.compile(r"(?<![:\w]):([A-Za-z_]\w*)")
_WRITE_RETRIES = 5
_BEST_TRIES = 3
_PROBE_CONNECT_TIMEOUT_S = 1
_RETRY_WAIT_S = 1.0


@lru_cache(maxsize=512)
def _pg(sql: str) -> str:
    """``:name`` placeholders to psycopg's ``%(name)s`` (a ``::cast`` is left alone)."""
    return _PLACEHOLDER.sub(r"%(\1)s", sql)


class _PgTx:
    __slots__ = ("_conn",)

    def __init__(self, conn: psycopg.AsyncConnection[Any]) -> None:
        self._conn = conn

    async def fetchone(self, sql: str, params: Params | None = None) -> rows.Row | None:
        cur = await self._conn.execute(_pg(sql), params)
        return await cur.fetchone()

    async def fetchall(self, sql: str, params: Params | None = None) -> list[rows.Row]:
        cur = await self._conn.execute(_pg(sql), params)
        return await cur.fetchall()

    async def execute(self, sql: str, params: Params | None = None) -> int:
        cur = await self._conn.execute(_pg(sql), params)
        return cur.rowcount

    async def executemany(self, sql: str, params: Sequence[Params]) -> None:
        async with self._conn.cursor() as cur:
            await cur.executemany(_pg(sql), params)


def _is_unique(exc: BaseException) -> bool:
    return isinstance(exc, psycopg.errors.UniqueViolation)


def _is_unreachable(exc: psycopg.Error) -> bool:
    """No answer from the server (refused, timed out, connection lost: no SQLSTATE), a connection
    exception (class 08) or the server shutting down (57P01-57P03); not a query it refused."""
    if isinstance(exc, psycopg.InterfaceError):
        return True
    state = exc.sqlstate
    return state is None or state.startswith("08") or state in ("57P01", "57P02", "57P03")


def _translate(exc: psycopg.Error) -> StoreError:
    if isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError):
        return StoreUnavailable(f"postgres: {exc}")
    if isinstance(exc, psycopg.errors.UndefinedTable):
        return StoreError(f"the store's schema is missing (run migrate first): {exc}")
    return StoreError(f"postgres: {exc}")


# The hot path, one statement: take the room on the host row, then record the claim.
_RESERVE = _pg(
    f"""WITH h AS (
        UPDATE hosts SET reserved_mb = reserved_mb + :mb, reserved_cpu_m = reserved_cpu_m + :cpu
        WHERE id = :h AND {fit_condition()}
        RETURNING id
    )
    INSERT INTO reservations ({rows.RESERVATION_COLS})
    SELECT :id, h.id, :mb, :cpu, :owner, :sid, :now, :exp FROM h
    RETURNING id"""
)

# Omega's shared state in one round trip: among the candidates, the one with the most room by the
# store's current totals. ``picked`` without ``took`` means another writer won that host's row first.
# SKIP LOCKED passes over a host whose row another reservation is writing: a writer that queued for
# that lock would re-check only that the host still fits, not that it is still the roomiest, so
# every writer queued behind one lock lands on the same host (a burst across four replicas put
# twelve of fifty creates on one host of twelve). When every candidate is locked, nothing is picked
# and the locking path below waits for the rows and decides on their newest totals. ``:c`` comes in
# the core's tie-break order, so among equally good hosts the first in it wins (as on SQLite).
# A candidate with expired, unswept claims sends the create to the locking path too, which ends them
# first: the counters still hold them, and the pick must rank by live totals as the core does.
_RESERVE_BEST = _pg(
    f"""WITH pick AS (
        SELECT id FROM hosts
        WHERE id = ANY(:c) AND {fit_condition()}
          AND NOT EXISTS (SELECT 1 FROM reservations WHERE host_id = ANY(:c) AND expires_at <= :now)
        ORDER BY {room_order()}, array_position(CAST(:c AS text[]), id) LIMIT 1
        FOR UPDATE SKIP LOCKED
    ), h AS (
        UPDATE hosts SET reserved_mb = hosts.reserved_mb + :mb, reserved_cpu_m = hosts.reserved_cpu_m + :cpu
        FROM pick
        WHERE hosts.id = pick.id AND {fit_condition("hosts.")}
        RETURNING hosts.id
    ), ins AS (
        INSERT INTO reservations ({rows.RESERVATION_COLS})
        SELECT :id, h.id, :mb, :cpu, :owner, :sid, :now, :exp FROM h
        RETURNING host_id
    )
    SELECT (SELECT id FROM pick), (SELECT host_id FROM ins)"""
)

# All or nothing, one statement: lock the hosts in id order (FOR UPDATE hands back their newest
# versions), decide whether every host's sum fits, and only then add to the counters and record the
# claims. One statement means the row locks are held only while the server works and commits, never
# across a client round trip.
_RESERVE_BATCH = _pg(
    f"""WITH need AS (
        SELECT * FROM unnest(CAST(:hids AS text[]), CAST(:hmb AS bigint[]), CAST(:hcpu AS bigint[])) AS d(id, mb, cpu)
    ), locked AS (
        SELECT id, state, memory_mb_admittable, reserved_mb, cpu_total, cpu_used, reserved_cpu_m
        FROM hosts WHERE id = ANY(CAST(:hids AS text[]))
        ORDER BY id FOR UPDATE
    ), verdict AS (
        SELECT count(*) = :nhosts AS fits
        FROM locked JOIN need ON need.id = locked.id
        WHERE {fit_condition("locked.", "need.mb", "need.cpu")}
    ), upd AS (
        UPDATE hosts SET reserved_mb = hosts.reserved_mb + need.mb, reserved_cpu_m = hosts.reserved_cpu_m + need.cpu
        FROM need, verdict
        WHERE verdict.fits AND hosts.id = need.id
        RETURNING hosts.id
    ), ins AS (
        INSERT INTO reservations ({rows.RESERVATION_COLS})
        SELECT r.id, r.host_id, r.mb, r.cpu, :owner, r.sid, :now, :exp
        FROM unnest(CAST(:rids AS text[]), CAST(:rhosts AS text[]), CAST(:rmb AS bigint[]),
                    CAST(:rcpu AS bigint[]), CAST(:rsids AS text[])) AS r(id, host_id, mb, cpu, sid), verdict
        WHERE verdict.fits
        RETURNING 1
    )
    SELECT (SELECT fits FROM verdict), (SELECT count(*) FROM upd), (SELECT count(*) FROM ins)"""
)


class PostgresStore(SqlStore):
    dialect = "postgres"
    for_update = " FOR UPDATE"

    def __init__(
        self,
        conninfo: str,
        *,
        schema: str | None = None,
        pool_size: int = 10,
        pool_timeout_s: float = 5.0,
        clock: Clock | None = None,
    ) -> None:
        super().__init__(clock)
        if schema is not None and not _SCHEMA_NAME.match(schema):
            raise InvalidRecord(f"schema: {schema!r} is not a plain lower-case identifier")
        if pool_size < 1:
            raise InvalidRecord("pool_size: must be at least 1")
        self.conninfo = conninfo
        self.schema = schema
        self.pool_size = pool_size
        self.pool_timeout_s = pool_timeout_s
        self._pool: AsyncConnectionPool[Any] | None = None
        self._open_lock = asyncio.Lock()
        self.breaker = Breaker(self._probe, self._renew_pool, self.clock)
        self._retired: set[asyncio.Task[None]] = set()
        self._wakes: set[Callable[[], None]] = set()
        self._listener: asyncio.Task[None] | None = None

    @classmethod
    def from_url(cls, url: str, *, clock: Clock | None = None) -> PostgresStore:
        parts = urlsplit(url)
        query = dict(parse_qsl(parts.query))
        try:
            schema = query.pop("schema", None)
            pool_size = int(query.pop("pool_size", "10"))
            pool_timeout_s = float(query.pop("pool_timeout", "5"))
        except ValueError as exc:
            raise InvalidRecord(f"store URL: {exc}") from exc
        query.setdefault("connect_timeout", "5")
        conninfo = urlunsplit(parts._replace(query=urlencode(query)))
        return cls(conninfo, schema=schema, pool_size=pool_size, pool_timeout_s=pool_timeout_s, clock=clock)

    # -- connections ---------------------------------------------------------------------------

    async def _get_pool(self) -> AsyncConnectionPool[Any]:
        if self._pool is not None:
            return self._pool
        async with self._open_lock:
            if self._pool is None:
                kwargs: dict[str, Any] = {"autocommit": True}
                if self.schema is not None:
                    kwargs["options"] = f"-c search_path={self.schema}"
                pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
                    self.conninfo,
                    min_size=1,
                    max_size=self.pool_size,
                    kwargs=kwargs,
                    timeout=self.pool_timeout_s,
                    open=False,
                    name="corral-store",
                )
                # Do not wait for the first connection: an unreachable server must surface as
                # StoreUnavailable on first use, and the pool keeps reconnecting in the background.
                await pool.open(wait=False)
                self._pool = pool
            return self._pool

    def on_change(self, wake: Callable[[], None]) -> Callable[[], None]:
        self._wakes.add(wake)
        if self._listener is None or self._listener.done():
            self._listener = asyncio.get_running_loop().create_task(self._listen(), name="corral-listen")
        return lambda: self._wakes.discard(wake)

    def _wake_all(self) -> None:
        for wake in list(self._wakes):
            wake()

    async def _listen(self) -> None:
        """One connection of its own, LISTENing to the change feed's channel; the triggers NOTIFY at
        each commit. Lost, it connects again (and wakes everyone: a change may have gone unheard)."""
        while True:
            try:
                conn = await psycopg.AsyncConnection.connect(self.conninfo, autocommit=True)
                try:
                    await conn.execute("LISTEN corral_changes")
                    self._wake_all()
                    async for _ in conn.notifies():
                        self._wake_all()
                finally:
                    await conn.close()
            except (psycopg.Error, OSError):
                await asyncio.sleep(_RETRY_WAIT_S)

    async def close(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await listener
        await self.breaker.close()
        pool, self._pool = self._pool, None
        if pool is not None:
            await pool.close()
        for task in list(self._retired):
            await task

    async def _probe(self) -> None:
        """One fresh connection and a trivial query, bounded to about a second: is the server back?"""
        kwargs: dict[str, Any] = {"autocommit": True, "connect_timeout": _PROBE_CONNECT_TIMEOUT_S}
        conn = await psycopg.AsyncConnection.connect(self.conninfo, **kwargs)
        try:
            await asyncio.wait_for(conn.execute("SELECT 1"), _PROBE_CONNECT_TIMEOUT_S)
        finally:
            await conn.close()

    async def _renew_pool(self) -> None:
        """After an outage: a new pool, which connects at once, instead of the old one's dead
        connections and reconnect back-off. The old pool closes in the background."""
        old, self._pool = self._pool, None
        if old is not None:
            task = asyncio.get_running_loop().create_task(old.close())
            self._retired.add(task)
            task.add_done_callback(self._retired.discard)

    def _unreachable(self, exc: psycopg.Error) -> None:
        """Open the breaker when ``exc`` says the server could not be reached or went away."""
        if _is_unreachable(exc):
            self.breaker.suspect(exc)

    # -- transactions --------------------------------------------------------------------------

    async def _write(self, fn: Callable[[Tx], Awaitable[T]]) -> T:
        return await self._transaction(lambda conn: fn(_PgTx(conn)))

    async def _transaction(self, fn: Callable[[psycopg.AsyncConnection[Any]], Awaitable[T]]) -> T:
        """Run ``fn`` in one transaction of a pooled connection, retrying deadlocks."""
        self.breaker.check()
        pool = await self._get_pool()
        attempt = 0
        while True:
            try:
                async with pool.connection() as conn, conn.transaction():
                    return await fn(conn)
            except psycopg.errors.TransactionRollback as exc:
                # Deadlock or serialisation failure: the transaction did nothing; do it again.
                attempt += 1
                if attempt >= _WRITE_RETRIES:
                    raise StoreUnavailable(f"postgres: gave up after {attempt} conflicts: {exc}") from exc
                await asyncio.sleep(random.uniform(0, 0.005 * attempt))
            except psycopg.Error as exc:
                if _is_unique(exc):
                    raise
                if isinstance(exc, psycopg.OperationalError):
                    self._unreachable(exc)
                    await self._evict_broken(pool)
                raise _translate(exc) from exc

    @staticmethod
    async def _evict_broken(pool: AsyncConnectionPool[Any]) -> None:
        """After a connection failure, drop every idle connection that is dead too (a server restart
        kills them all), so the next caller gets a live one instead of the next corpse."""
        with contextlib.suppress(psycopg.Error):
            await pool.check()

    async def _autocommit(self, sql: str, params: Params) -> rows.Row | None:
        """One statement, its own transaction: the hot paths' single round trip."""
        self.breaker.check()
        pool = await self._get_pool()
        try:
            # getconn/putconn rather than ``connection()``: in autocommit there is no transaction to
            # end on the way out, and this is the path whose overhead the benchmark reads.
            conn = await pool.getconn()
            try:
                cur = await conn.execute(sql, params)
                row: rows.Row | None = await cur.fetchone()
                return row
            finally:
                await pool.putconn(conn)
        except psycopg.Error as exc:
            if isinstance(exc, psycopg.OperationalError):
                self._unreachable(exc)
                await self._evict_broken(pool)
            raise _translate(exc) from exc

    async def _read(self, fn: Callable[[Tx], Awaitable[T]]) -> T:
        self.breaker.check()
        pool = await self._get_pool()
        # Reads are safe to repeat: one retry rides over a connection the server dropped (the pool
        # hands out a fresh one), so a restarted server costs no failed read.
        for attempt in (0, 1):
            # The retry waits briefly: a restarted server gives a fresh connection in milliseconds,
            # while a server that is gone would hold the caller for the pool's whole timeout.
            wait = self.pool_timeout_s if attempt == 0 else min(self.pool_timeout_s, _RETRY_WAIT_S)
            try:
                async with pool.connection(timeout=wait) as conn:
                    return await fn(_PgTx(conn))
            except psycopg.OperationalError as exc:
                # A pool that waited out its timeout has no live connection to retry on.
                if attempt or isinstance(exc, psycopg.errors.TransactionRollback | PoolTimeout):
                    self._unreachable(exc)
                    raise _translate(exc) from exc
                await self._evict_broken(pool)
            except psycopg.Error as exc:
                raise _translate(exc) from exc
        raise AssertionError("the loop returns or raises")  # pragma: no cover

    def _is_unique_violation(self, exc: BaseException) -> bool:
        return _is_unique(exc)

    # -- lifecycle -----------------------------------------------------------------------------

    async def migrate(self) -> int:
        now = self._now()
        schema = self.schema

        async def run(conn: psycopg.AsyncConnection[Any]) -> int:
            tx = _PgTx(conn)
            # Replicas starting at once queue here, per schema; the loser finds the work done.
            await conn.execute(
                "SELECT pg_advisory_xact_lock(hashtext(%s))", [f"corral.migrate:{schema or 'public'}"]
            )
            if schema is not None:
                await conn.execute(
                    pgsql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(pgsql.Identifier(schema))
                )
                await conn.execute(pgsql.SQL("SET LOCAL search_path TO {}").format(pgsql.Identifier(schema)))
            return await self._apply_migrations(tx, conn.execute, now)

        return await self._transaction(run)

    # -- hot paths -----------------------------------------------------------------------------

    async def _reserve_one(self, r: ReservationRecord) -> ReservationRecord | None:
        if await self._autocommit(_RESERVE, self._res_params(r)) is not None:
            return r
        # No room by the counters, which still hold expired, unswept claims: end those, try again.
        return await super()._reserve_one(r)

    async def _reserve_best(
        self, candidates: Sequence[str], claim: Callable[[], ReservationRecord], image: str | None = None
    ) -> ReservationRecord | None:
        for _ in range(_BEST_TRIES):
            r = claim()
            hosts = by_tie_rank(r.sandbox_id or r.id, candidates)
            got = await self._autocommit(
                _RESERVE_BEST, {**self._res_params(r), "c": hosts, "img": image_pattern(image)}
            )
            assert got is not None
            picked, took = got
            if took is not None:
                return ReservationRecord(
                    r.id, took, r.memory_mb, r.cpu, r.owner, r.sandbox_id, r.created_at, r.expires_at
                )
            if picked is None:
                break
        # Nothing fits by the counters, or we kept losing races: decide under the hosts' row locks,
        # after ending their expired claims.
        return await super()._reserve_best(candidates, claim, image)

    async def _reserve_all(
        self, records: list[ReservationRecord], need: dict[str, list[int]]
    ) -> list[ReservationRecord] | None:
        hosts = sorted(need)
        params = {
            "hids": hosts,
            "hmb": [need[h][0] for h in hosts],
            "hcpu": [need[h][1] for h in hosts],
            "nhosts": len(hosts),
            "rids": [r.id for r in records],
            "rhosts": [r.host_id for r in records],
            "rmb": [r.memory_mb for r in records],
            "rcpu": [rows.to_millicores(r.cpu) for r in records],
            "rsids": [r.sandbox_id for r in records],
            "owner": records[0].owner,
            "now": records[0].created_at,
            "exp": records[0].expires_at,
        }
        got = await self._autocommit(_RESERVE_BATCH, params)
        if got is not None and got[0]:
            return records
        # Short by the counters: retry once the hosts' expired claims are ended.
        return await super()._reserve_all(records, need)
