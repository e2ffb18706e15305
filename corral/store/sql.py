"""What both SQL backends share: every operation of the contract written once against a small
transaction seam (:class:`Tx`), in the SQL subset SQLite and PostgreSQL both speak.

A backend supplies ``_write`` (run a function in one write transaction: ``BEGIN IMMEDIATE`` on
SQLite, a pooled connection's transaction on PostgreSQL), ``_read``, a row-lock clause and its driver's
error mapping, and may override a hot path with a faster single statement.

Reservation bookkeeping. ``hosts.reserved_mb`` / ``reserved_cpu_m`` count every reservation row of the
host, and every change to a row changes the counter in the same transaction, so capacity can be
checked with one conditional UPDATE of one row (which PostgreSQL re-checks against the newest row
version under concurrency: the double-booking guard). Rows that expired but were not swept are still
in the counter; readers subtract them, and a reservation that finds no room first ends the expired
ones of that host and tries again, so an expired reservation never costs a refusal.

Lock order, to keep PostgreSQL free of deadlocks: host rows first (several at once: sorted by id),
then reservation rows.
"""

from __future__ import annotations

import hashlib
import secrets
from abc import abstractmethod
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from typing import Any, ClassVar, Protocol, TypeVar

from corral.clock import SystemClock
from corral.core.clock import Clock
from corral.core.types import MAX_SANDBOX_PIDS, MIN_SANDBOX_PIDS, AdmissionMode, HostState, Pending
from corral.ids import random_hex
from corral.jsontext import dumps_sorted
from corral.store import listings, rows
from corral.store.contract import (
    FAILOVER_POLICIES,
    LIVE_STATES,
    UNSET,
    CreateOutcome,
    FailedHost,
    HeartbeatResult,
    HostEnrolment,
    HostHasSandboxes,
    HostRecord,
    HostReport,
    IdempotencyMismatch,
    InvalidRecord,
    ListingChange,
    NameConflict,
    Page,
    PoolRecord,
    Principal,
    QuotaExceeded,
    RecordNotFound,
    ReservationRecord,
    ReserveItem,
    Role,
    SandboxRecord,
    SandboxState,
    StateConflict,
    Store,
    TemplateRecord,
    TenantRecord,
    TokenRecord,
    TokenRevoked,
    Usage,
    _Unset,
    as_states,
    metadata_dict,
)
from corral.store.fit import by_tie_rank, fit_condition, room_order
from corral.store.rows import in_list

T = TypeVar("T")
Params = Mapping[str, Any]

MAX_PAGE = 1000


_FITS = fit_condition()
_ROOM_ORDER = room_order()
# ``state`` in a form no index serves: where a narrower index exists (expiry, tenant, host), the state
# index (nearly every sandbox is running) must not be the planner's choice.
UNINDEXED_STATE = "(state || '')"
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


def _check_reservation(memory_mb: int, cpu: float, ttl_s: float) -> None:
    if memory_mb < 0:
        raise InvalidRecord("memory_mb: a reservation cannot be negative")
    if cpu < 0:
        raise InvalidRecord("cpu: a reservation cannot be negative")
    if not ttl_s > 0:
        raise InvalidRecord("ttl_s: must be positive")


def _check_quota(max_sandboxes: int, max_memory_mb: int) -> None:
    if max_sandboxes < 0 or max_memory_mb < 0:
        raise InvalidRecord("max_sandboxes/max_memory_mb: must not be negative")


class SqlStore(Store):
    dialect: ClassVar[str]
    # Appended to a SELECT that must lock the rows it reads (empty where the transaction already
    # holds the whole database, as SQLite's BEGIN IMMEDIATE does).
    for_update: ClassVar[str] = ""

    def __init__(self, clock: Clock | None = None) -> None:
        self.clock: Clock = clock if clock is not None else SystemClock()

    # -- the seam ------------------------------------------------------------------------------

    @abstractmethod
    async def _write(self, fn: Callable[[Tx], Awaitable[T]]) -> T:
        """Run ``fn`` in one write transaction; roll back if it raises."""

    @abstractmethod
    async def _read(self, fn: Callable[[Tx], Awaitable[T]]) -> T:
        """Run ``fn`` against a consistent read."""

    @abstractmethod
    def _is_unique_violation(self, exc: BaseException) -> bool: ...

    def _now(self) -> float:
        return self.clock.now()

    # -- hosts ---------------------------------------------------------------------------------

    async def _host(self, tx: Tx, host_id: str, now: float) -> HostRecord | None:
        sql = rows.HOSTS_SELECT.format(scope="AND host_id = :id") + " WHERE h.id = :id"
        row = await tx.fetchone(sql, {"now": now, "id": host_id})
        return rows.host_from_row(row) if row is not None else None

    async def register_host(self, host_id: str, *, address: str = "", role: str = "worker") -> HostRecord:
        if not host_id:
            raise InvalidRecord("host_id: must not be empty")
        now = self._now()

        async def run(tx: Tx) -> HostRecord:
            await tx.execute(
                """INSERT INTO hosts (id, address, role, registered_at) VALUES (:id, :address, :role, :now)
                   ON CONFLICT (id) DO UPDATE SET
                     address = CASE WHEN excluded.address <> '' THEN excluded.address ELSE hosts.address END,
                     role = excluded.role""",
                {"id": host_id, "address": address, "role": role, "now": now},
            )
            host = await self._host(tx, host_id, now)
            assert host is not None
            return host

        return await self._write(run)

    async def record_oom_kills(self, host_id: str, counts: Mapping[str, int]) -> None:
        if not counts:
            return

        async def run(tx: Tx) -> None:
            for sandbox_id, count in sorted(counts.items()):
                await tx.execute(
                    "UPDATE sandboxes SET oom_kills = :n WHERE id = :id AND host_id = :h AND oom_kills < :n",
                    {"n": count, "id": sandbox_id, "h": host_id},
                )

        await self._write(run)

    async def upsert_heartbeat(self, hb: HostReport) -> HeartbeatResult:
        if not hb.host_id:
            raise InvalidRecord("host_id: must not be empty")
        now = self._now()
        f = hb.facts
        params = {
            "id": hb.host_id,
            "address": hb.address,
            "now": now,
            "seq": hb.seq,
            "cpu_total": f.cpu_total,
            "cpu_used": f.cpu_used,
            "mt": f.memory_mb_total,
            "mu": f.memory_mb_used,
            "ma": f.memory_mb_admittable,
            "mode": AdmissionMode(f.memory_admission).value,
            "templates": rows.json_list(f.templates),
            "runtime": f.runtime,
            "gpu": f.gpu,
            "role": f.role,
            "sr": bool(f.stream_restore),
            "warm": rows.warm_to_json(hb.warm),
        }

        async def run(tx: Tx) -> HeartbeatResult:
            # The upsert takes the host's row lock first (the lock order); the WHERE drops a delayed
            # heartbeat. ``state`` is not in the SET list: a heartbeat never undrains a host.
            applied = await tx.fetchone(
                """INSERT INTO hosts (id, address, heartbeat_at, seq, cpu_total, cpu_used, memory_mb_total,
                       memory_mb_used, memory_mb_admittable, memory_admission, templates, runtime, gpu, role,
                       stream_restore, registered_at, warm)
                   VALUES (:id, :address, :now, :seq, :cpu_total, :cpu_used, :mt, :mu, :ma, :mode,
                       :templates, :runtime, :gpu, :role, :sr, :now, :warm)
                   ON CONFLICT (id) DO UPDATE SET
                     address = CASE WHEN excluded.address <> '' THEN excluded.address ELSE hosts.address END,
                     heartbeat_at = excluded.heartbeat_at, seq = excluded.seq,
                     cpu_total = excluded.cpu_total, cpu_used = excluded.cpu_used,
                     memory_mb_total = excluded.memory_mb_total, memory_mb_used = excluded.memory_mb_used,
                     memory_mb_admittable = excluded.memory_mb_admittable,
                     memory_admission = excluded.memory_admission, templates = excluded.templates,
                     runtime = excluded.runtime, gpu = excluded.gpu, role = excluded.role,
                     stream_restore = excluded.stream_restore,
                     warm = excluded.warm
                   WHERE hosts.seq < excluded.seq
                   RETURNING listed_seq, listed_digest""",
                params,
            )
            confirmed = 0
            fenced: frozenset[str] = frozenset()
            if applied is not None:
                held_seq = None if applied[0] is None else int(applied[0])
                listed = await listings.apply(tx, hb, held_seq, int(applied[1]), now)
                done = await listings.confirmable(tx, hb)
                if done:
                    clause, ids = in_list("r", done)
                    confirmed = await self._end_where(tx, f"id IN {clause}", ids)
                if listed:
                    fenced = await listings.fences(tx, hb.host_id)
            host = await self._host(tx, hb.host_id, now)
            assert host is not None
            return HeartbeatResult(host, applied is not None, confirmed, fenced)

        return await self._write(run)

    async def listing_changes(self, since: float) -> list[ListingChange]:
        return await self._read(lambda tx: listings.changes(tx, since))

    async def listed(self, host_id: str, sandbox_ids: Collection[str]) -> dict[str, int]:
        return await self._read(lambda tx: listings.held(tx, host_id, sandbox_ids))

    async def listed_hosts(self, sandbox_ids: Collection[str]) -> dict[str, str]:
        return await self._read(lambda tx: listings.hosts_of(tx, sandbox_ids))

    async def prune_listings(self, before: float) -> int:
        return await self._write(
            lambda tx: tx.execute(
                "DELETE FROM listed_sandboxes WHERE present = :no AND changed_at < :before",
                {"no": False, "before": before},
            )
        )

    async def committed_mb(self) -> int:
        row = await self._read(lambda tx: tx.fetchone("SELECT coalesce(sum(live_memory_mb), 0) FROM tenants"))
        return int(row[0]) if row is not None else 0

    async def fail_host(self, host_id: str, dead_before: float, *, evacuate: bool = False) -> FailedHost:
        now = self._now()

        async def run(tx: Tx) -> FailedHost:
            # Under the host's row lock, and only if it is still silent: a heartbeat that lands first
            # wins, and nothing of a live host is orphaned.
            row = await tx.fetchone(
                f"SELECT heartbeat_at, state FROM hosts WHERE id = :h{self.for_update}", {"h": host_id}
            )
            if row is None:
                return FailedHost(0, 0, 0)
            silent = float(row[0] or 0.0) < dead_before
            if not silent and not (evacuate and row[1] == HostState.DRAINING.value):
                return FailedHost(0, 0, 0)
            params = {"h": host_id, "now": now}
            recreating = await tx.execute(
                "UPDATE sandboxes SET state = 'recreating', updated_at = :now, version = version + 1 "
                "WHERE host_id = :h AND state = 'running' AND failover = 'recreate'",
                params,
            )
            orphaned = 0
            released = 0
            if silent:
                orphaned = await tx.execute(
                    "UPDATE sandboxes SET state = 'orphaned', updated_at = :now, version = version + 1 "
                    "WHERE host_id = :h AND state = 'running'",
                    params,
                )
                released = await self._end_where(tx, "host_id = :h", {"h": host_id})
            return FailedHost(orphaned, recreating, released)

        return await self._write(run)

    async def reassign_sandbox(
        self, sandbox_id: str, *, expect_version: int, host_id: str, reservation_id: str, placement: str
    ) -> SandboxRecord:
        now = self._now()

        async def run(tx: Tx) -> SandboxRecord:
            before = await tx.fetchone(
                f"SELECT host_id FROM sandboxes WHERE id = :id{self.for_update}", {"id": sandbox_id}
            )
            row = await tx.fetchone(
                "UPDATE sandboxes SET host_id = :h, epoch = epoch + 1, recreated_at = :now, updated_at = :now, "
                "reservation_id = :rid, placement = :pl, version = version + 1 "
                "WHERE id = :id AND version = :v AND state = 'recreating' "
                f"RETURNING {rows.SANDBOX_COLS}",
                {
                    "id": sandbox_id,
                    "v": expect_version,
                    "h": host_id,
                    "rid": reservation_id,
                    "pl": placement,
                    "now": now,
                },
            )
            if row is None:
                current = await self._sandbox(tx, sandbox_id)
                if current is None:
                    raise RecordNotFound(f"sandbox {sandbox_id!r}")
                raise StateConflict(sandbox_id, current.state, current.version)
            rec = rows.sandbox_from_row(row)
            # Every host that may hold an older copy is fenced: the one it left, whoever that was.
            old = await tx.fetchall("SELECT host_id FROM fences WHERE sandbox_id = :id", {"id": sandbox_id})
            hosts = {str(r[0]) for r in old}
            if before is not None and before[0]:
                hosts.add(str(before[0]))
            hosts.discard(host_id)
            await tx.execute("DELETE FROM fences WHERE sandbox_id = :id", {"id": sandbox_id})
            for host in sorted(hosts):
                await tx.execute(
                    "INSERT INTO fences (host_id, sandbox_id, epoch) VALUES (:h, :id, :e)",
                    {"e": rec.epoch, "h": host, "id": sandbox_id},
                )
            return rec

        return await self._write(run)

    async def park_sandbox(self, sandbox_id: str, wait_until: float) -> SandboxRecord:
        now = self._now()

        async def run(tx: Tx) -> SandboxRecord:
            row = await tx.fetchone(
                "UPDATE sandboxes SET state = 'waiting_capacity', wait_until = :w, host_id = NULL, "
                "reservation_id = NULL, updated_at = :now, version = version + 1 "
                f"WHERE id = :id AND state = 'reserved' RETURNING {rows.SANDBOX_COLS}",
                {"id": sandbox_id, "w": wait_until, "now": now},
            )
            if row is None:
                current = await self._sandbox(tx, sandbox_id)
                if current is None:
                    raise RecordNotFound(f"sandbox {sandbox_id!r}")
                raise StateConflict(sandbox_id, current.state, current.version)
            return rows.sandbox_from_row(row)

        return await self._write(run)

    async def sealed_spec(self, sandbox_id: str) -> str | None:
        async def run(tx: Tx) -> str | None:
            row = await tx.fetchone("SELECT spec FROM sandboxes WHERE id = :id", {"id": sandbox_id})
            return None if row is None or row[0] is None else str(row[0])

        return await self._read(run)

    async def sealed_specs(self, after_id: str, limit: int) -> list[tuple[str, str]]:
        async def run(tx: Tx) -> list[tuple[str, str]]:
            got = await tx.fetchall(
                "SELECT id, spec FROM sandboxes WHERE id > :a AND spec IS NOT NULL ORDER BY id LIMIT :lim",
                {"a": after_id, "lim": limit},
            )
            return [(str(i), str(sp)) for i, sp in got]

        return await self._read(run)

    async def replace_sealed_spec(self, sandbox_id: str, old: str, new: str) -> bool:
        async def run(tx: Tx) -> bool:
            n = await tx.execute(
                "UPDATE sandboxes SET spec = :new WHERE id = :id AND spec = :old",
                {"id": sandbox_id, "old": old, "new": new},
            )
            return n == 1

        return await self._write(run)

    async def _set_host_state(self, host_id: str, state: HostState) -> HostRecord:
        now = self._now()

        async def run(tx: Tx) -> HostRecord:
            n = await tx.execute(
                "UPDATE hosts SET state = :s WHERE id = :id", {"s": state.value, "id": host_id}
            )
            if n == 0:
                raise RecordNotFound(f"host {host_id!r}")
            host = await self._host(tx, host_id, now)
            assert host is not None
            return host

        return await self._write(run)

    async def drain(self, host_id: str) -> HostRecord:
        return await self._set_host_state(host_id, HostState.DRAINING)

    async def undrain(self, host_id: str) -> HostRecord:
        return await self._set_host_state(host_id, HostState.READY)

    async def delete_host(self, host_id: str) -> bool:
        async def run(tx: Tx) -> bool:
            await self._end_where(tx, "host_id = :h", {"h": host_id})
            await tx.execute("DELETE FROM listed_sandboxes WHERE host_id = :id", {"id": host_id})
            return await tx.execute("DELETE FROM hosts WHERE id = :id", {"id": host_id}) > 0

        return await self._write(run)

    async def get_host(self, host_id: str) -> HostRecord | None:
        now = self._now()
        return await self._read(lambda tx: self._host(tx, host_id, now))

    async def list_hosts(self) -> list[HostRecord]:
        now = self._now()
        sql = rows.HOSTS_SELECT.format(scope="") + " ORDER BY h.id"

        async def run(tx: Tx) -> list[HostRecord]:
            return [rows.host_from_row(r) for r in await tx.fetchall(sql, {"now": now})]

        return await self._read(run)

    # -- reservations: ending them -------------------------------------------------------------

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

    async def _fold_expired(self, tx: Tx, host_ids: Collection[str], now: float) -> int:
        clause, params = in_list("f", sorted(host_ids))
        return await self._end_where(
            tx, f"host_id IN {clause} AND expires_at <= :now", {**params, "now": now}
        )

    async def _end_one(self, reservation_id: str) -> bool:
        async def run(tx: Tx) -> bool:
            return await self._end_where(tx, "id = :rid", {"rid": reservation_id}) > 0

        return await self._write(run)

    async def confirm(self, reservation_id: str) -> bool:
        return await self._end_one(reservation_id)

    async def cancel(self, reservation_id: str) -> bool:
        # Only the reservation row: a sandbox record is never touched from here.
        return await self._end_one(reservation_id)

    async def sweep_expired(self) -> int:
        now = self._now()
        return await self._write(lambda tx: self._end_where(tx, "expires_at <= :now", {"now": now}))

    async def drop_owner(self, owner: str) -> int:
        return await self._write(lambda tx: self._end_where(tx, "owner = :o", {"o": owner}))

    # -- reservations: taking them -------------------------------------------------------------

    _TAKE = (
        "UPDATE hosts SET reserved_mb = reserved_mb + :mb, reserved_cpu_m = reserved_cpu_m + :cpu "
        f"WHERE id = :h AND {_FITS} RETURNING id"
    )
    _INSERT = (
        f"INSERT INTO reservations ({rows.RESERVATION_COLS}) "
        "VALUES (:id, :h, :mb, :cpu, :owner, :sid, :now, :exp)"
    )

    def _reservation(
        self,
        host_id: str,
        memory_mb: int,
        cpu: float,
        owner: str,
        ttl_s: float,
        sandbox_id: str | None,
        now: float | None = None,
    ) -> ReservationRecord:
        if now is None:
            now = self._now()
        return ReservationRecord(
            id=random_hex(128),
            host_id=host_id,
            memory_mb=memory_mb,
            cpu=rows.from_millicores(rows.to_millicores(cpu)),
            owner=owner,
            sandbox_id=sandbox_id,
            created_at=now,
            expires_at=now + ttl_s,
        )

    @staticmethod
    def _res_params(r: ReservationRecord) -> dict[str, Any]:
        return {
            "id": r.id,
            "h": r.host_id,
            "mb": r.memory_mb,
            "cpu": rows.to_millicores(r.cpu),
            "owner": r.owner,
            "sid": r.sandbox_id,
            "now": r.created_at,
            "exp": r.expires_at,
        }

    async def _take(self, tx: Tx, r: ReservationRecord) -> bool:
        p = self._res_params(r)
        took = await tx.fetchone(self._TAKE, p)
        if took is None and await self._fold_expired(tx, [r.host_id], r.created_at):
            took = await tx.fetchone(self._TAKE, p)
        if took is None:
            return False
        await tx.execute(self._INSERT, p)
        return True

    async def reserve(
        self,
        host_id: str,
        *,
        memory_mb: int,
        cpu: float = 0.0,
        owner: str,
        ttl_s: float,
        sandbox_id: str | None = None,
    ) -> ReservationRecord | None:
        _check_reservation(memory_mb, cpu, ttl_s)
        r = self._reservation(host_id, memory_mb, cpu, owner, ttl_s, sandbox_id)

        async def run(tx: Tx) -> ReservationRecord | None:
            return r if await self._take(tx, r) else None

        return await self._write(run)

    async def reserve_best(
        self,
        candidates: Sequence[str],
        *,
        memory_mb: int,
        cpu: float = 0.0,
        owner: str,
        ttl_s: float,
        sandbox_id: str | None = None,
    ) -> ReservationRecord | None:
        _check_reservation(memory_mb, cpu, ttl_s)
        if not candidates:
            return None
        template = self._reservation("", memory_mb, cpu, owner, ttl_s, sandbox_id)
        ranked = by_tie_rank(sandbox_id or template.id, candidates)
        clause, params = in_list("c", ranked)
        tie = "CASE id " + " ".join(f"WHEN :{k} THEN {i}" for i, k in enumerate(params)) + " END"
        # The pick and the take in one statement; the outer conditions hold the row to the same test
        # (PostgreSQL re-checks them against the newest version of a row another create just took).
        take_best = (
            "UPDATE hosts SET reserved_mb = reserved_mb + :mb, reserved_cpu_m = reserved_cpu_m + :cpu "
            f"WHERE id = (SELECT id FROM hosts WHERE id IN {clause} AND {_FITS} "
            f"AND NOT EXISTS (SELECT 1 FROM reservations WHERE host_id IN {clause} AND expires_at <= :now) "
            f"ORDER BY {_ROOM_ORDER}, {tie} LIMIT 1) AND {_FITS} RETURNING id"
        )
        p = {**params, "mb": memory_mb, "cpu": rows.to_millicores(template.cpu), "now": template.created_at}

        async def run(tx: Tx) -> ReservationRecord | None:
            await self._lock_hosts(tx, params.values())
            took = await tx.fetchone(take_best, p)
            # A candidate's expired claims, still on its counter, make the pick wait until they are
            # ended: it ranks by live totals, as the core does.
            if took is None and await self._fold_expired(tx, params.values(), template.created_at):
                took = await tx.fetchone(take_best, p)
            if took is None:
                return None
            r = _with_host(template, took[0])
            await tx.execute(self._INSERT, self._res_params(r))
            return r

        return await self._write(run)

    def _batch(
        self, items: Sequence[ReserveItem], owner: str, ttl_s: float
    ) -> tuple[list[ReservationRecord], dict[str, list[int]]]:
        """A batch's reservation records, and what it needs per host: [memory MiB, millicores]."""
        for it in items:
            _check_reservation(it.memory_mb, it.cpu, ttl_s)
        now = self._now()
        records = [
            self._reservation(i.host_id, i.memory_mb, i.cpu, owner, ttl_s, i.sandbox_id, now) for i in items
        ]
        need: dict[str, list[int]] = {}
        for r in records:
            t = need.setdefault(r.host_id, [0, 0])
            t[0] += r.memory_mb
            t[1] += rows.to_millicores(r.cpu)
        return records, need

    async def reserve_batch(
        self, items: Sequence[ReserveItem], *, owner: str, ttl_s: float
    ) -> list[ReservationRecord] | None:
        if not items:
            return []
        records, need = self._batch(items, owner, ttl_s)
        now = records[0].created_at

        async def run(tx: Tx) -> list[ReservationRecord]:
            await self._lock_hosts(tx, need)
            await self._fold_expired(tx, need, now)
            for host_id, (mb, cpu_m) in sorted(need.items()):
                took = await tx.fetchone(self._TAKE, {"h": host_id, "mb": mb, "cpu": cpu_m})
                if took is None:
                    raise _NoRoom(host_id)
            await tx.executemany(self._INSERT, [self._res_params(r) for r in records])
            return records

        try:
            return await self._write(run)
        except _NoRoom:
            return None

    async def get_reservation(self, reservation_id: str) -> ReservationRecord | None:
        async def run(tx: Tx) -> ReservationRecord | None:
            row = await tx.fetchone(
                f"SELECT {rows.RESERVATION_COLS} FROM reservations WHERE id = :id", {"id": reservation_id}
            )
            return rows.reservation_from_row(row) if row is not None else None

        return await self._read(run)

    async def outstanding(self) -> dict[str, Pending]:
        now = self._now()

        async def run(tx: Tx) -> dict[str, Pending]:
            got = await tx.fetchall(
                "SELECT host_id, CAST(sum(memory_mb) AS BIGINT), CAST(sum(cpu_m) AS BIGINT) FROM reservations "
                "WHERE expires_at > :now GROUP BY host_id ORDER BY host_id",
                {"now": now},
            )
            return {h: Pending(int(mb), rows.from_millicores(int(c))) for h, mb, c in got}

        return await self._read(run)

    async def next_expiry(self) -> float | None:
        now = self._now()

        async def run(tx: Tx) -> float | None:
            row = await tx.fetchone(
                "SELECT min(expires_at) FROM reservations WHERE expires_at > :now", {"now": now}
            )
            return float(row[0]) if row is not None and row[0] is not None else None

        return await self._read(run)

    async def audit(self) -> list[str]:
        async def run(tx: Tx) -> list[str]:
            got = await tx.fetchall(
                """SELECT h.id, h.reserved_mb, h.reserved_cpu_m, coalesce(x.mb, 0), coalesce(x.cpu_m, 0)
                   FROM hosts h LEFT JOIN (
                     SELECT host_id, CAST(sum(memory_mb) AS BIGINT) AS mb, CAST(sum(cpu_m) AS BIGINT) AS cpu_m
                     FROM reservations GROUP BY host_id) x ON x.host_id = h.id
                   ORDER BY h.id"""
            )
            problems = [
                f"host {h}: counters {mb} MiB / {c} mcpu, reservation rows {rmb} MiB / {rc} mcpu"
                for h, mb, c, rmb, rc in got
                if int(mb) != int(rmb) or int(c) != int(rc) or int(mb) < 0 or int(c) < 0
            ]
            clause, params = in_list("st", sorted(st.value for st in LIVE_STATES))
            for t, n, mb, rn, rmb in await tx.fetchall(
                f"""SELECT t.id, t.live_sandboxes, t.live_memory_mb, coalesce(x.n, 0), coalesce(x.mb, 0)
                    FROM tenants t LEFT JOIN (
                      SELECT tenant_id, count(*) AS n, CAST(sum(memory_mb) AS BIGINT) AS mb FROM sandboxes
                      WHERE state IN {clause} GROUP BY tenant_id) x ON x.tenant_id = t.id""",
                params,
            ):
                if int(n) != int(rn) or int(mb) != int(rmb):
                    problems.append(
                        f"tenant {t}: usage counters {n} / {mb} MiB, live sandboxes {rn} / {rmb} MiB"
                    )
            stray = await tx.fetchone(
                "SELECT count(*) FROM reservations WHERE host_id NOT IN (SELECT id FROM hosts)"
            )
            if stray is not None and int(stray[0]):
                problems.append(f"{int(stray[0])} reservations name no known host")
            return problems

        return await self._read(run)

    # -- leases --------------------------------------------------------------------------------

    async def renew_replica(self, replica_id: str, ttl_s: float) -> float:
        if not ttl_s > 0:
            raise InvalidRecord("ttl_s: must be positive")
        expires_at = self._now() + ttl_s

        async def run(tx: Tx) -> float:
            await tx.execute(
                "INSERT INTO replicas (id, expires_at) VALUES (:id, :exp) "
                "ON CONFLICT (id) DO UPDATE SET expires_at = excluded.expires_at",
                {"id": replica_id, "exp": expires_at},
            )
            return expires_at

        return await self._write(run)

    async def release_replica(self, replica_id: str) -> int:
        async def run(tx: Tx) -> int:
            ended = await self._end_where(tx, "owner = :o", {"o": replica_id})
            await tx.execute("DELETE FROM replicas WHERE id = :id", {"id": replica_id})
            return ended

        return await self._write(run)

    async def expire_replicas(self) -> list[str]:
        now = self._now()

        async def run(tx: Tx) -> list[str]:
            lapsed = [
                r[0]
                for r in await tx.fetchall(
                    f"SELECT id FROM replicas WHERE expires_at <= :now ORDER BY id{self.for_update}",
                    {"now": now},
                )
            ]
            for replica_id in lapsed:
                await self._end_where(tx, "owner = :o", {"o": replica_id})
                await tx.execute("DELETE FROM replicas WHERE id = :id", {"id": replica_id})
            return lapsed

        return await self._write(run)

    async def try_lead(self, name: str, holder: str, ttl_s: float) -> bool:
        if not ttl_s > 0:
            raise InvalidRecord("ttl_s: must be positive")
        now = self._now()

        async def run(tx: Tx) -> bool:
            row = await tx.fetchone(
                """INSERT INTO leases (name, holder, expires_at) VALUES (:n, :h, :exp)
                   ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, expires_at = excluded.expires_at
                   WHERE leases.holder = excluded.holder OR leases.expires_at <= :now
                   RETURNING holder""",
                {"n": name, "h": holder, "exp": now + ttl_s, "now": now},
            )
            return row is not None

        return await self._write(run)

    async def resign(self, name: str, holder: str) -> bool:
        async def run(tx: Tx) -> bool:
            return (
                await tx.execute(
                    "DELETE FROM leases WHERE name = :n AND holder = :h", {"n": name, "h": holder}
                )
                > 0
            )

        return await self._write(run)

    # -- sandboxes -----------------------------------------------------------------------------

    async def _sandbox(self, tx: Tx, sandbox_id: str) -> SandboxRecord | None:
        row = await tx.fetchone(
            f"SELECT {rows.SANDBOX_COLS} FROM sandboxes WHERE id = :id", {"id": sandbox_id}
        )
        return rows.sandbox_from_row(row) if row is not None else None

    async def _usage(self, tx: Tx, tenant_id: str) -> Usage:
        row = await tx.fetchone(
            "SELECT live_sandboxes, live_memory_mb FROM tenants WHERE id = :t", {"t": tenant_id}
        )
        return Usage(int(row[0]), int(row[1])) if row is not None else Usage(0, 0)

    async def _count_usage(self, tx: Tx, tenant_id: str, sandboxes: int, memory_mb: int) -> None:
        if sandboxes or memory_mb:
            await tx.execute(
                "UPDATE tenants SET live_sandboxes = live_sandboxes + :n, live_memory_mb = live_memory_mb + :mb "
                "WHERE id = :t",
                {"t": tenant_id, "n": sandboxes, "mb": memory_mb},
            )

    _COUNT_IF_ROOM = (
        "UPDATE tenants SET live_sandboxes = live_sandboxes + 1, live_memory_mb = live_memory_mb + :mb "
        "WHERE id = :t AND live_sandboxes + 1 <= max_sandboxes AND live_memory_mb + :mb <= max_memory_mb "
        "RETURNING id"
    )

    async def _check_name(self, tx: Tx, rec: SandboxRecord) -> None:
        if rec.name is not None:
            taken = await tx.fetchone(
                "SELECT id FROM sandboxes WHERE tenant_id = :t AND name = :n AND state <> 'deleted'",
                {"t": rec.tenant_id, "n": rec.name},
            )
            if taken is not None:
                raise NameConflict(f"name {rec.name!r} is taken by sandbox {taken[0]}")

    async def _create_checks(
        self,
        tx: Tx,
        rec: SandboxRecord,
        idempotency_key: str | None,
        request_hash: str | None,
        lock: bool,
    ) -> CreateOutcome | None:
        """Idempotency, name and quota, in the order ``create_sandbox`` applies them: a replay's
        outcome, or None when the record may be inserted."""
        # The tenant's row lock serialises its creates: the quota count below cannot be raced.
        tenant = await tx.fetchone(
            "SELECT max_sandboxes, max_memory_mb, live_sandboxes, live_memory_mb FROM tenants "
            f"WHERE id = :t{self.for_update if lock else ''}",
            {"t": rec.tenant_id},
        )
        if tenant is None:
            raise RecordNotFound(f"tenant {rec.tenant_id!r}")
        if idempotency_key is not None:
            seen = await tx.fetchone(
                "SELECT request_hash, sandbox_id, record FROM idempotency_keys WHERE tenant_id = :t AND key = :k",
                {"t": rec.tenant_id, "k": idempotency_key},
            )
            if seen is not None:
                if seen[0] is not None and request_hash is not None and seen[0] != request_hash:
                    raise IdempotencyMismatch(
                        f"idempotency key {idempotency_key!r} was first used with a different request"
                    )
                current = await self._sandbox(tx, seen[1])
                return CreateOutcome(current or rows.sandbox_from_json(seen[2]), replayed=True)
        await self._check_name(tx, rec)
        if rec.state in LIVE_STATES:
            used = Usage(int(tenant[2]), int(tenant[3]))
            if used.sandboxes + 1 > int(tenant[0]):
                raise QuotaExceeded("max_sandboxes", int(tenant[0]), used.sandboxes, 1)
            if used.memory_mb + rec.memory_mb > int(tenant[1]):
                raise QuotaExceeded("max_memory_mb", int(tenant[1]), used.memory_mb, rec.memory_mb)
        return None

    async def create_sandbox(
        self,
        record: SandboxRecord,
        *,
        idempotency_key: str | None = None,
        request_hash: str | None = None,
    ) -> CreateOutcome:
        _check_sandbox(record)
        now = self._now()
        rec = SandboxRecord(
            id=record.id,
            tenant_id=record.tenant_id,
            template=record.template,
            memory_mb=record.memory_mb,
            cpus=record.cpus,
            state=SandboxState(record.state),
            name=record.name,
            host_id=record.host_id,
            stateful=record.stateful,
            metadata=metadata_dict(record.metadata),
            created_at=now,
            updated_at=now,
            expires_at=record.expires_at,
            reservation_id=record.reservation_id,
            version=1,
            warm=record.warm,
            failover=record.failover,
            epoch=record.epoch,
            sealed_spec=record.sealed_spec,
        )

        counted = rec.state in LIVE_STATES

        async def run(tx: Tx) -> CreateOutcome:
            # Without an Idempotency-Key there is nothing to replay: the quota is checked and counted
            # by one conditional UPDATE (the tenant's row lock serialises its creates). When it refuses,
            # the full checks below name the limit that was hit.
            fast = (
                idempotency_key is None
                and counted
                and await tx.fetchone(self._COUNT_IF_ROOM, {"t": rec.tenant_id, "mb": rec.memory_mb})
                is not None
            )
            if fast:
                await self._check_name(tx, rec)
            else:
                replay = await self._create_checks(tx, rec, idempotency_key, request_hash, lock=True)
                if replay is not None:
                    return replay
                if counted:
                    await self._count_usage(tx, rec.tenant_id, 1, rec.memory_mb)
            await tx.execute(
                f"INSERT INTO sandboxes ({rows.SANDBOX_COLS}, spec) VALUES (:id, :t, :name, :template, :host, "
                ":state, :mb, :cpus, :stateful, :meta, :now, :now, :exp, :rid, 1, 0, :warm, :fo, :ep, NULL, NULL, :spec)",
                {
                    "id": rec.id,
                    "t": rec.tenant_id,
                    "name": rec.name,
                    "template": rec.template,
                    "host": rec.host_id,
                    "state": rec.state.value,
                    "mb": rec.memory_mb,
                    "cpus": rec.cpus,
                    "stateful": bool(rec.stateful),
                    "meta": _json(rec.metadata),
                    "now": now,
                    "exp": rec.expires_at,
                    "rid": rec.reservation_id,
                    "warm": bool(rec.warm),
                    "fo": rec.failover,
                    "ep": rec.epoch,
                    "spec": rec.sealed_spec,
                },
            )
            if idempotency_key is not None:
                await tx.execute(
                    "INSERT INTO idempotency_keys (tenant_id, key, request_hash, sandbox_id, record, created_at) "
                    "VALUES (:t, :k, :h, :id, :rec, :now)",
                    {
                        "t": rec.tenant_id,
                        "k": idempotency_key,
                        "h": request_hash,
                        "id": rec.id,
                        "rec": rows.sandbox_to_json(rec),
                        "now": now,
                    },
                )
            return CreateOutcome(rec, replayed=False)

        try:
            return await self._write(run)
        except Exception as exc:
            if self._is_unique_violation(exc):
                raise NameConflict(f"sandbox {rec.id!r} (or its name) already exists") from exc
            raise

    async def check_create(
        self,
        record: SandboxRecord,
        *,
        idempotency_key: str | None = None,
        request_hash: str | None = None,
    ) -> CreateOutcome | None:
        _check_sandbox(record)
        return await self._read(
            lambda tx: self._create_checks(tx, record, idempotency_key, request_hash, lock=False)
        )

    async def purge_idempotency_keys(self, older_than: float) -> int:
        async def run(tx: Tx) -> int:
            return await tx.execute("DELETE FROM idempotency_keys WHERE created_at < :t", {"t": older_than})

        return await self._write(run)

    async def set_sandbox_state(
        self,
        sandbox_id: str,
        state: SandboxState,
        *,
        expect: SandboxState | Collection[SandboxState] | None = None,
        expect_version: int | None = None,
        host_id: str | _Unset | None = UNSET,
        reservation_id: str | _Unset | None = UNSET,
        placement: str | _Unset | None = UNSET,
    ) -> SandboxRecord:
        try:
            new_state = SandboxState(state)
            expected = as_states(expect)
        except ValueError as exc:
            raise InvalidRecord(f"state: {exc}") from exc
        now = self._now()
        sets = ["state = :state", "updated_at = :now", "version = version + 1"]
        params: dict[str, Any] = {"id": sandbox_id, "state": new_state.value, "now": now}
        if not isinstance(host_id, _Unset):
            sets.append("host_id = :host")
            params["host"] = host_id
        if not isinstance(reservation_id, _Unset):
            sets.append("reservation_id = :rid")
            params["rid"] = reservation_id
        if not isinstance(placement, _Unset):
            sets.append("placement = :pl")
            params["pl"] = placement
        where = ["id = :id"]
        if expected is not None:
            clause, sp = in_list("x", sorted(s.value for s in expected))
            where.append(f"state IN {clause}")
            params.update(sp)
        if expect_version is not None:
            where.append("version = :v")
            params["v"] = expect_version
        # One conditional UPDATE: PostgreSQL re-checks the WHERE against the newest row version, so of
        # two concurrent compare-and-sets on the same state exactly one passes.
        sql = f"UPDATE sandboxes SET {', '.join(sets)} WHERE {' AND '.join(where)} RETURNING {rows.SANDBOX_COLS}"

        # Usage counters move only when a sandbox crosses between live and not-live states; when every
        # state it may be in now is on the same side as the new one, the one UPDATE is the whole story.
        same_side = expected is not None and all(
            (st in LIVE_STATES) == (new_state in LIVE_STATES) for st in expected
        )

        async def run(tx: Tx) -> SandboxRecord:
            before = None
            if not same_side:
                before = await tx.fetchone(
                    f"SELECT state FROM sandboxes WHERE id = :id{self.for_update}", {"id": sandbox_id}
                )
            row = await tx.fetchone(sql, params)
            if row is not None:
                rec = rows.sandbox_from_row(row)
                if before is not None:
                    delta = int(new_state in LIVE_STATES) - int(SandboxState(before[0]) in LIVE_STATES)
                    await self._count_usage(tx, rec.tenant_id, delta, delta * rec.memory_mb)
                return rec
            current = await self._sandbox(tx, sandbox_id)
            if current is None:
                raise RecordNotFound(f"sandbox {sandbox_id!r}")
            raise StateConflict(sandbox_id, current.state, current.version)

        try:
            return await self._write(run)
        except Exception as exc:
            if self._is_unique_violation(exc):
                raise NameConflict(f"sandbox {sandbox_id!r}: its name is taken by a live sandbox") from exc
            raise

    async def set_sandbox_expiry(self, sandbox_id: str, expires_at: float | None) -> SandboxRecord:
        now = self._now()

        async def run(tx: Tx) -> SandboxRecord:
            row = await tx.fetchone(
                f"UPDATE sandboxes SET expires_at = :exp, updated_at = :now, version = version + 1 "
                f"WHERE id = :id RETURNING {rows.SANDBOX_COLS}",
                {"id": sandbox_id, "exp": expires_at, "now": now},
            )
            if row is None:
                raise RecordNotFound(f"sandbox {sandbox_id!r}")
            return rows.sandbox_from_row(row)

        return await self._write(run)

    async def host_activity(self, since: float) -> dict[str, tuple[int, int]]:
        live, params = in_list("l", sorted(s.value for s in LIVE_STATES))

        async def run(tx: Tx) -> dict[str, tuple[int, int]]:
            placed = await tx.fetchall(
                "SELECT host_id, count(*) FROM sandboxes WHERE created_at >= :t AND host_id IS NOT NULL "
                "GROUP BY host_id",
                {"t": since},
            )
            committed = await tx.fetchall(
                f"SELECT host_id, CAST(sum(memory_mb) AS BIGINT) FROM sandboxes WHERE state IN {live} "
                "AND host_id IS NOT NULL GROUP BY host_id",
                params,
            )
            out: dict[str, tuple[int, int]] = {}
            for h, n in placed:
                out[h] = (int(n), 0)
            for h, mb in committed:
                out[h] = (out.get(h, (0, 0))[0], int(mb or 0))
            return out

        return await self._read(run)

    async def get_placement(self, sandbox_id: str, *, tenant_id: str | None = None) -> str | None:
        async def run(tx: Tx) -> str | None:
            row = await tx.fetchone(
                "SELECT tenant_id, placement FROM sandboxes WHERE id = :id", {"id": sandbox_id}
            )
            if row is None or (tenant_id is not None and row[0] != tenant_id):
                raise RecordNotFound(f"sandbox {sandbox_id!r}")
            return None if row[1] is None else str(row[1])

        return await self._read(run)

    async def get_sandbox(self, sandbox_id: str, *, tenant_id: str | None = None) -> SandboxRecord | None:
        async def run(tx: Tx) -> SandboxRecord | None:
            rec = await self._sandbox(tx, sandbox_id)
            if rec is None or (tenant_id is not None and rec.tenant_id != tenant_id):
                return None
            return rec

        return await self._read(run)

    async def get_sandboxes(self, sandbox_ids: Collection[str]) -> dict[str, SandboxRecord]:
        async def run(tx: Tx) -> dict[str, SandboxRecord]:
            out: dict[str, SandboxRecord] = {}
            for part in listings.chunks(sandbox_ids):
                clause, params = in_list("g", part)
                for r in await tx.fetchall(
                    f"SELECT {rows.SANDBOX_COLS} FROM sandboxes WHERE id IN {clause}", params
                ):
                    rec = rows.sandbox_from_row(r)
                    out[rec.id] = rec
            return out

        return await self._read(run)

    async def list_sandboxes(
        self,
        *,
        tenant_id: str | None = None,
        host_id: str | None = None,
        state: SandboxState | Collection[SandboxState] | None = None,
        limit: int = 100,
        cursor: str | None = None,
    ) -> Page:
        if not 1 <= limit <= MAX_PAGE:
            raise InvalidRecord(f"limit: must be 1..{MAX_PAGE}")
        try:
            states = as_states(state)
        except ValueError as exc:
            raise InvalidRecord(f"state: {exc}") from exc
        where: list[str] = []
        params: dict[str, Any] = {"lim": limit + 1}
        if tenant_id is not None:
            where.append("tenant_id = :t")
            params["t"] = tenant_id
        if host_id is not None:
            where.append("host_id = :h")
            params["h"] = host_id
        if states is not None:
            clause, sp = in_list("s", sorted(s.value for s in states))
            # A tenant's or a host's sandboxes are found by their own index, never by reading every
            # sandbox in a state (most are running).
            column = "state" if tenant_id is None and host_id is None else UNINDEXED_STATE
            where.append(f"{column} IN {clause}")
            params.update(sp)
        if cursor is not None:
            after_at, after_id = rows.decode_cursor(cursor)
            where.append("(created_at > :ca OR (created_at = :ca AND id > :cid))")
            params.update(ca=after_at, cid=after_id)
        sql = (
            f"SELECT {rows.SANDBOX_COLS} FROM sandboxes"
            + (" WHERE " + " AND ".join(where) if where else "")
            + " ORDER BY created_at, id LIMIT :lim"
        )

        async def run(tx: Tx) -> Page:
            got = [rows.sandbox_from_row(r) for r in await tx.fetchall(sql, params)]
            if len(got) <= limit:
                return Page(got, None)
            last = got[limit - 1]
            return Page(got[:limit], rows.encode_cursor(last.created_at, last.id))

        return await self._read(run)

    async def delete_sandbox(self, sandbox_id: str, *, forget_idempotency: bool = False) -> bool:
        async def run(tx: Tx) -> bool:
            if forget_idempotency:
                await tx.execute("DELETE FROM idempotency_keys WHERE sandbox_id = :id", {"id": sandbox_id})
            gone = await tx.fetchone(
                "DELETE FROM sandboxes WHERE id = :id RETURNING tenant_id, state, memory_mb",
                {"id": sandbox_id},
            )
            if gone is None:
                return False
            if SandboxState(gone[1]) in LIVE_STATES:
                await self._count_usage(tx, str(gone[0]), -1, -int(gone[2]))
            return True

        return await self._write(run)

    async def expired_sandboxes(self, now: float | None = None, *, limit: int = 100) -> list[SandboxRecord]:
        at = self._now() if now is None else now
        clause, params = in_list("s", sorted(s.value for s in LIVE_STATES))

        async def run(tx: Tx) -> list[SandboxRecord]:
            got = await tx.fetchall(
                f"SELECT {rows.SANDBOX_COLS} FROM sandboxes WHERE expires_at IS NOT NULL AND expires_at <= :now "
                f"AND {UNINDEXED_STATE} IN {clause} ORDER BY expires_at, id LIMIT :lim",
                {"now": at, "lim": limit, **params},
            )
            return [rows.sandbox_from_row(r) for r in got]

        return await self._read(run)

    # -- tenants, tokens -----------------------------------------------------------------------

    async def create_tenant(self, name: str, *, max_sandboxes: int, max_memory_mb: int) -> TenantRecord:
        if not name:
            raise InvalidRecord("name: must not be empty")
        _check_quota(max_sandboxes, max_memory_mb)
        rec = TenantRecord("tn_" + secrets.token_hex(8), name, max_sandboxes, max_memory_mb, self._now())

        async def run(tx: Tx) -> TenantRecord:
            await tx.execute(
                f"INSERT INTO tenants ({rows.TENANT_COLS}) VALUES (:id, :n, :ms, :mm, :now)",
                {"id": rec.id, "n": name, "ms": max_sandboxes, "mm": max_memory_mb, "now": rec.created_at},
            )
            return rec

        try:
            return await self._write(run)
        except Exception as exc:
            if self._is_unique_violation(exc):
                raise NameConflict(f"tenant {name!r} exists") from exc
            raise

    async def _tenant_where(self, where: str, params: Params) -> list[TenantRecord]:
        async def run(tx: Tx) -> list[TenantRecord]:
            got = await tx.fetchall(f"SELECT {rows.TENANT_COLS} FROM tenants {where}", params)
            return [rows.tenant_from_row(r) for r in got]

        return await self._read(run)

    async def get_tenant(self, tenant_id: str) -> TenantRecord | None:
        got = await self._tenant_where("WHERE id = :id", {"id": tenant_id})
        return got[0] if got else None

    async def get_tenant_by_name(self, name: str) -> TenantRecord | None:
        got = await self._tenant_where("WHERE name = :n", {"n": name})
        return got[0] if got else None

    async def list_tenants(self) -> list[TenantRecord]:
        return await self._tenant_where("ORDER BY name", {})

    async def set_quota(self, tenant_id: str, *, max_sandboxes: int, max_memory_mb: int) -> TenantRecord:
        _check_quota(max_sandboxes, max_memory_mb)

        async def run(tx: Tx) -> TenantRecord:
            row = await tx.fetchone(
                f"UPDATE tenants SET max_sandboxes = :ms, max_memory_mb = :mm WHERE id = :id "
                f"RETURNING {rows.TENANT_COLS}",
                {"id": tenant_id, "ms": max_sandboxes, "mm": max_memory_mb},
            )
            if row is None:
                raise RecordNotFound(f"tenant {tenant_id!r}")
            return rows.tenant_from_row(row)

        return await self._write(run)

    async def usage(self, tenant_id: str) -> Usage:
        return await self._read(lambda tx: self._usage(tx, tenant_id))

    async def issue_token(self, tenant_id: str | None, role: Role) -> str:
        plaintext = _TOKEN_PREFIX + secrets.token_urlsafe(32)
        await self.ensure_token(plaintext, tenant_id, role)
        return plaintext

    async def ensure_token(self, plaintext: str, tenant_id: str | None, role: Role) -> Principal:
        return await self._ensure_token(plaintext, tenant_id, role, None)

    async def adopt_token(
        self, plaintext: str, tenant_id: str | None, role: Role, *, source: str
    ) -> Principal:
        return await self._ensure_token(plaintext, tenant_id, role, source)

    async def _ensure_token(
        self, plaintext: str, tenant_id: str | None, role: Role, source: str | None
    ) -> Principal:
        if len(plaintext) < 16:
            raise InvalidRecord("token: must be at least 16 characters")
        try:
            want = Role(role)
        except ValueError as exc:
            raise InvalidRecord(f"role: {exc}") from exc
        if want is Role.TENANT and tenant_id is None:
            raise InvalidRecord("tenant_id: a tenant token needs a tenant")
        digest = token_hash(plaintext)
        token_id = "tok_" + secrets.token_hex(8)
        now = self._now()

        async def run(tx: Tx) -> Principal:
            if (
                tenant_id is not None
                and await tx.fetchone("SELECT id FROM tenants WHERE id = :t", {"t": tenant_id}) is None
            ):
                raise RecordNotFound(f"tenant {tenant_id!r}")
            if await tx.fetchone("SELECT 1 FROM revoked_tokens WHERE hash = :h", {"h": digest}):
                raise TokenRevoked("this token was revoked; configure a new one")
            await tx.execute(
                "INSERT INTO tokens (id, hash, tenant_id, role, created_at, source) "
                "VALUES (:id, :h, :t, :r, :now, :src) ON CONFLICT (hash) DO NOTHING",
                {"id": token_id, "h": digest, "t": tenant_id, "r": want.value, "now": now, "src": source},
            )
            row = await tx.fetchone(
                "SELECT id, tenant_id, role, host_id FROM tokens WHERE hash = :h", {"h": digest}
            )
            assert row is not None
            if row[1] != tenant_id or row[2] != want.value or row[3] is not None:
                raise NameConflict("this token is already stored for another tenant or role")
            if source is not None:
                await tx.execute(
                    "UPDATE tokens SET source = :src WHERE id = :id", {"src": source, "id": row[0]}
                )
                await self._revoke_where(
                    tx,
                    "source = :src AND role = :r AND id <> :id",
                    {"src": source, "r": want.value, "id": row[0]},
                )
            return Principal(row[0], row[1], Role(row[2]))

        return await self._write(run)

    async def resolve_token(self, plaintext: str) -> Principal | None:
        digest = token_hash(plaintext)

        async def run(tx: Tx) -> Principal | None:
            row = await tx.fetchone(
                "SELECT id, tenant_id, role, host_id FROM tokens WHERE hash = :h", {"h": digest}
            )
            return Principal(row[0], row[1], Role(row[2]), row[3]) if row is not None else None

        return await self._read(run)

    @staticmethod
    async def _bump_epoch(tx: Tx) -> None:
        await tx.execute("UPDATE auth_epoch SET epoch = epoch + 1 WHERE id = 1")

    async def _revoke_where(self, tx: Tx, where: str, params: Params) -> int:
        """Revoke every token matching ``where`` in this transaction: remember its hash, delete it, and
        advance the epoch replicas follow. Returns how many."""
        await tx.execute(
            f"INSERT INTO revoked_tokens (hash, revoked_at) SELECT hash, :revoked_at FROM tokens WHERE {where} "
            "ON CONFLICT (hash) DO NOTHING",
            {**params, "revoked_at": self._now()},
        )
        gone = await tx.execute(f"DELETE FROM tokens WHERE {where}", params)
        if gone:
            await self._bump_epoch(tx)
        return gone

    async def revoke_token(self, token_id: str) -> bool:
        async def run(tx: Tx) -> bool:
            return await self._revoke_where(tx, "id = :id", {"id": token_id}) > 0

        return await self._write(run)

    async def list_tokens(self, *, tenant_id: str | None = None) -> list[TokenRecord]:
        where = "" if tenant_id is None else "WHERE tenant_id = :t"

        async def run(tx: Tx) -> list[TokenRecord]:
            got = await tx.fetchall(
                f"SELECT id, role, tenant_id, host_id, source, created_at FROM tokens {where} "
                "ORDER BY created_at, id",
                {"t": tenant_id},
            )
            return [TokenRecord(r[0], Role(r[1]), r[2], r[3], r[4], float(r[5])) for r in got]

        return await self._read(run)

    async def auth_epoch(self) -> int:
        async def run(tx: Tx) -> int:
            row = await tx.fetchone("SELECT epoch FROM auth_epoch WHERE id = 1")
            return int(row[0]) if row is not None else 0

        return await self._read(run)

    async def fleet_secret(self, name: str) -> str:
        if not name:
            raise InvalidRecord("name: must not be empty")
        made = secrets.token_urlsafe(32)

        async def run(tx: Tx) -> str:
            # Two replicas asking at once: the first insert wins and both read what it wrote.
            await tx.execute(
                "INSERT INTO fleet_secrets (name, value, created_at) VALUES (:n, :v, :now) "
                "ON CONFLICT (name) DO NOTHING",
                {"n": name, "v": made, "now": self._now()},
            )
            row = await tx.fetchone("SELECT value FROM fleet_secrets WHERE name = :n", {"n": name})
            assert row is not None
            return str(row[0])

        return await self._write(run)

    # -- host identity -------------------------------------------------------------------------

    async def enrol_host(self, host_id: str) -> HostEnrolment:
        if not host_id:
            raise InvalidRecord("host_id: must not be empty")
        creds = HostEnrolment(host_id, _TOKEN_PREFIX + secrets.token_urlsafe(32), secrets.token_urlsafe(32))
        now = self._now()

        async def run(tx: Tx) -> HostEnrolment:
            # A new identity starts its sequence over: whatever the previous credentials sent no
            # longer binds the host.
            await tx.execute(
                "INSERT INTO hosts (id, registered_at) VALUES (:id, :now) "
                "ON CONFLICT (id) DO UPDATE SET seq = -1",
                {"id": host_id, "now": now},
            )
            await self._revoke_where(tx, "host_id = :h", {"h": host_id})
            await tx.execute(
                "INSERT INTO tokens (id, hash, tenant_id, role, created_at, host_id) "
                "VALUES (:id, :h, NULL, :r, :now, :host)",
                {
                    "id": "tok_" + secrets.token_hex(8),
                    "h": token_hash(creds.agent_token),
                    "r": Role.AGENT.value,
                    "now": now,
                    "host": host_id,
                },
            )
            await tx.execute(
                "INSERT INTO host_keys (host_id, key, created_at) VALUES (:h, :k, :now) "
                "ON CONFLICT (host_id) DO UPDATE SET key = excluded.key, created_at = excluded.created_at",
                {"h": host_id, "k": creds.host_key, "now": now},
            )
            await self._bump_epoch(tx)
            return creds

        return await self._write(run)

    async def host_key(self, host_id: str) -> str | None:
        async def run(tx: Tx) -> str | None:
            row = await tx.fetchone("SELECT key FROM host_keys WHERE host_id = :h", {"h": host_id})
            return str(row[0]) if row is not None else None

        return await self._read(run)

    async def forget_host(self, host_id: str) -> bool:
        clause, params = in_list("s", sorted(s.value for s in LIVE_STATES))

        async def run(tx: Tx) -> bool:
            live = await tx.fetchone(
                f"SELECT count(*) FROM sandboxes WHERE host_id = :h AND state IN {clause}",
                {"h": host_id, **params},
            )
            if live is not None and int(live[0]) > 0:
                raise HostHasSandboxes(f"host {host_id} has {int(live[0])} live sandboxes")
            await self._end_where(tx, "host_id = :h", {"h": host_id})
            await tx.execute("DELETE FROM listed_sandboxes WHERE host_id = :h", {"h": host_id})
            found = await tx.execute("DELETE FROM hosts WHERE id = :h", {"h": host_id}) > 0
            found = await tx.execute("DELETE FROM host_keys WHERE host_id = :h", {"h": host_id}) > 0 or found
            return await self._revoke_where(tx, "host_id = :h", {"h": host_id}) > 0 or found

        return await self._write(run)

    # -- templates -----------------------------------------------------------------------------

    async def create_template(self, template: TemplateRecord) -> TemplateRecord:
        if not template.name:
            raise InvalidRecord("name: must not be empty")
        if template.memory_mb <= 0 or template.cpus <= 0:
            raise InvalidRecord("memory_mb/cpus: must be positive")
        if not MIN_SANDBOX_PIDS <= template.pids <= MAX_SANDBOX_PIDS:
            raise InvalidRecord(f"pids: must be between {MIN_SANDBOX_PIDS} and {MAX_SANDBOX_PIDS}")
        rec = TemplateRecord(
            template.name,
            template.cpus,
            template.memory_mb,
            template.stateful,
            template.runtime,
            template.description,
            self._now(),
            template.pids,
            template.failover,
        )
        if rec.failover not in FAILOVER_POLICIES:
            raise InvalidRecord(f"failover: one of {', '.join(FAILOVER_POLICIES)}")

        async def run(tx: Tx) -> TemplateRecord:
            await tx.execute(
                f"INSERT INTO templates ({rows.TEMPLATE_COLS}) VALUES (:n, :c, :m, :s, :r, :d, :now, :p, :f)",
                {
                    "n": rec.name,
                    "c": rec.cpus,
                    "m": rec.memory_mb,
                    "s": bool(rec.stateful),
                    "r": rec.runtime,
                    "d": rec.description,
                    "now": rec.created_at,
                    "p": rec.pids,
                    "f": rec.failover,
                },
            )
            return rec

        try:
            return await self._write(run)
        except Exception as exc:
            if self._is_unique_violation(exc):
                raise NameConflict(f"template {template.name!r} exists") from exc
            raise

    async def get_template(self, name: str) -> TemplateRecord | None:
        async def run(tx: Tx) -> TemplateRecord | None:
            row = await tx.fetchone(
                f"SELECT {rows.TEMPLATE_COLS} FROM templates WHERE name = :n", {"n": name}
            )
            return rows.template_from_row(row) if row is not None else None

        return await self._read(run)

    async def list_templates(self) -> list[TemplateRecord]:
        async def run(tx: Tx) -> list[TemplateRecord]:
            got = await tx.fetchall(f"SELECT {rows.TEMPLATE_COLS} FROM templates ORDER BY name")
            return [rows.template_from_row(r) for r in got]

        return await self._read(run)

    # -- warm pools ----------------------------------------------------------------------------

    async def _pools(self, tx: Tx, template: str | None) -> list[PoolRecord]:
        where, params = ("WHERE template = :t", {"t": template}) if template is not None else ("", {})
        found = await tx.fetchall(_POOLS_WITH_TARGETS.format(where=where), params)
        targets: dict[str, dict[str, int]] = {}
        for t, host, n in await tx.fetchall(
            f"SELECT template, host_id, target FROM pool_targets {where} ORDER BY template, host_id", params
        ):
            targets.setdefault(t, {})[host] = int(n)
        return [rows.pool_from_row(r, targets.get(r[0], {})) for r in found]

    async def create_pool(self, template: str, *, size: int, max_per_host: int | None = None) -> PoolRecord:
        _check_pool(size, max_per_host)
        now = self._now()

        async def run(tx: Tx) -> PoolRecord:
            if await tx.fetchone("SELECT 1 FROM templates WHERE name = :t", {"t": template}) is None:
                raise RecordNotFound(f"template {template!r}")
            if await tx.fetchone("SELECT 1 FROM pools WHERE template = :t", {"t": template}) is not None:
                raise NameConflict(f"template {template!r} already has a pool")
            await tx.execute(
                "INSERT INTO pools (template, size, max_per_host, created_at, updated_at) "
                "VALUES (:t, :size, :mph, :now, :now)",
                {"t": template, "size": size, "mph": max_per_host, "now": now},
            )
            return (await self._pools(tx, template))[0]

        try:
            return await self._write(run)
        except Exception as exc:
            if self._is_unique_violation(exc):
                raise NameConflict(f"template {template!r} already has a pool") from exc
            raise

    async def update_pool(
        self, template: str, *, size: int | None = None, max_per_host: int | _Unset | None = UNSET
    ) -> PoolRecord:
        _check_pool(size, max_per_host)
        sets, params = ["updated_at = :now"], {"t": template, "now": self._now()}
        if size is not None:
            sets.append("size = :size")
            params["size"] = size
        if not isinstance(max_per_host, _Unset):
            sets.append("max_per_host = :mph")
            params["mph"] = max_per_host

        async def run(tx: Tx) -> PoolRecord:
            if await tx.execute(f"UPDATE pools SET {', '.join(sets)} WHERE template = :t", params) == 0:
                raise RecordNotFound(f"no pool for template {template!r}")
            return (await self._pools(tx, template))[0]

        return await self._write(run)

    async def delete_pool(self, template: str) -> bool:
        async def run(tx: Tx) -> bool:
            await tx.execute("DELETE FROM pool_targets WHERE template = :t", {"t": template})
            return await tx.execute("DELETE FROM pools WHERE template = :t", {"t": template}) > 0

        return await self._write(run)

    async def list_pools(self) -> list[PoolRecord]:
        return await self._read(lambda tx: self._pools(tx, None))

    async def set_pool_targets(self, template: str, targets: Mapping[str, int]) -> bool:
        if any(n < 0 for n in targets.values()):
            raise InvalidRecord("targets: must not be negative")
        keep = [{"t": template, "h": h, "n": n} for h, n in sorted(targets.items()) if n > 0]

        async def run(tx: Tx) -> bool:
            if await tx.fetchone("SELECT 1 FROM pools WHERE template = :t", {"t": template}) is None:
                return False
            await tx.execute("DELETE FROM pool_targets WHERE template = :t", {"t": template})
            if keep:
                await tx.executemany(
                    "INSERT INTO pool_targets (template, host_id, target) VALUES (:t, :h, :n)", keep
                )
            return True

        return await self._write(run)

    async def delete_template(self, name: str) -> bool:
        async def run(tx: Tx) -> bool:
            return await tx.execute("DELETE FROM templates WHERE name = :n", {"n": name}) > 0

        return await self._write(run)


_POOLS_WITH_TARGETS = f"SELECT {rows.POOL_COLS} FROM pools {{where}} ORDER BY template"


def _check_pool(size: int | None, max_per_host: int | _Unset | None) -> None:
    if size is not None and size < 0:
        raise InvalidRecord("size: must not be negative")
    if isinstance(max_per_host, int) and max_per_host <= 0:
        raise InvalidRecord("max_per_host: must be positive")


def _with_host(r: ReservationRecord, host_id: str) -> ReservationRecord:
    return ReservationRecord(
        r.id, host_id, r.memory_mb, r.cpu, r.owner, r.sandbox_id, r.created_at, r.expires_at
    )


def _check_sandbox(r: SandboxRecord) -> None:
    if not r.id:
        raise InvalidRecord("id: must not be empty")
    if not r.tenant_id:
        raise InvalidRecord("tenant_id: must not be empty")
    if r.memory_mb <= 0:
        raise InvalidRecord("memory_mb: must be positive")
    if r.cpus < 0:
        raise InvalidRecord("cpus: must not be negative")
    if r.name is not None and not r.name:
        raise InvalidRecord("name: must not be empty (use None for no name)")
    if r.failover not in FAILOVER_POLICIES:
        raise InvalidRecord(f"failover: one of {', '.join(FAILOVER_POLICIES)}")
    try:
        SandboxState(r.state)
    except ValueError as exc:
        raise InvalidRecord(f"state: {exc}") from exc


def _json(metadata: Mapping[str, str]) -> str:
    return dumps_sorted(dict(metadata)) if metadata else "{}"
