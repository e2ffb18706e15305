"""Reservations: capacity promised on a host until a heartbeat shows the sandbox, taken with one
conditional UPDATE of the host row and ended with the counter in the same transaction."""

from __future__ import annotations

import functools
from collections.abc import Callable, Collection, Sequence
from typing import Any

from corral.core.types import Pending
from corral.ids import time_ordered_hex
from corral.store import rows
from corral.store.fit import by_tie_rank, image_pattern
from corral.store.records import (
    LIVE_STATES,
    ReservationRecord,
    ReserveItem,
    check_reservation,
    claim_record,
)
from corral.store.rows import in_list
from corral.store.sql.base import (
    _FITS,
    _ROOM_ORDER,
    SqlBase,
    Tx,
    _NoRoom,
    _with_host,
)


@functools.lru_cache(maxsize=64)
def _take_best(n: int) -> str:
    """The pick and the take in one statement, for ``n`` candidates bound as ``:c0`` .. (best tie rank
    first); its text depends only on ``n``. The outer conditions hold the row to the same test
    (PostgreSQL re-checks them against the newest version of a row another create just took)."""
    clause, params = in_list("c", range(n))
    tie = "CASE id " + " ".join(f"WHEN :{k} THEN {i}" for i, k in enumerate(params)) + " END"
    return (
        "UPDATE hosts SET reserved_mb = reserved_mb + :mb, reserved_cpu_m = reserved_cpu_m + :cpu "
        f"WHERE id = (SELECT id FROM hosts WHERE id IN {clause} AND {_FITS} "
        f"AND NOT EXISTS (SELECT 1 FROM reservations WHERE host_id IN {clause} AND expires_at <= :now) "
        f"ORDER BY {_ROOM_ORDER}, {tie} LIMIT 1) AND {_FITS} RETURNING id"
    )


class ReservationsSql(SqlBase):
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

    _TAKE = (
        "UPDATE hosts SET reserved_mb = reserved_mb + :mb, reserved_cpu_m = reserved_cpu_m + :cpu "
        f"WHERE id = :h AND {_FITS} RETURNING id"
    )
    _INSERT = (
        f"INSERT INTO reservations ({rows.RESERVATION_COLS}) "
        "VALUES (:id, :h, :mb, :cpu, :owner, :sid, :now, :exp)"
    )

    def _claim(
        self, item: ReserveItem, owner: str, ttl_s: float, now: float | None = None
    ) -> ReservationRecord:
        now = self._now() if now is None else now
        return claim_record(time_ordered_hex(now, 84), item, owner, ttl_s, now)

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

    async def _reserve_checked(self, item: ReserveItem, owner: str, ttl_s: float) -> ReservationRecord | None:
        return await self._reserve_one(self._claim(item, owner, ttl_s))

    async def _reserve_one(self, r: ReservationRecord) -> ReservationRecord | None:
        """Take ``r``'s room on its host and write it; None where it does not fit."""

        async def run(tx: Tx) -> ReservationRecord | None:
            return r if await self._take(tx, r) else None

        return await self._write(run)

    async def _reserve_best_checked(
        self, candidates: Sequence[str], item: ReserveItem, owner: str, ttl_s: float, image: str | None
    ) -> ReservationRecord | None:
        return await self._reserve_best(candidates, lambda: self._claim(item, owner, ttl_s), image)

    async def _reserve_best(
        self, candidates: Sequence[str], claim: Callable[[], ReservationRecord], image: str | None = None
    ) -> ReservationRecord | None:
        """The roomiest of ``candidates`` taken for a claim that ``claim()`` makes afresh (its host
        left empty, to be filled in); None where none fits. A host holding ``image`` ranks first among
        equals (see ``image_pattern``)."""
        template = claim()
        ranked = by_tie_rank(template.sandbox_id or template.id, candidates)
        take_best = _take_best(len(ranked))
        _, p = in_list("c", ranked)  # the names the cached text binds
        p.update(
            mb=template.memory_mb,
            cpu=rows.to_millicores(template.cpu),
            now=template.created_at,
            img=image_pattern(image),
        )

        async def run(tx: Tx) -> ReservationRecord | None:
            await self._lock_hosts(tx, ranked)
            took = await tx.fetchone(take_best, p)
            # A candidate's expired claims, still on its counter, make the pick wait until they are
            # ended: it ranks by live totals, as the core does.
            if took is None and await self._fold_expired(tx, ranked, template.created_at):
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
            check_reservation(it.memory_mb, it.cpu, ttl_s)
        now = self._now()
        records = [self._claim(i, owner, ttl_s, now) for i in items]
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
        return await self._reserve_all(records, need)

    async def _reserve_all(
        self, records: list[ReservationRecord], need: dict[str, list[int]]
    ) -> list[ReservationRecord] | None:
        """Take every one of ``records`` (``need``: their sums per host) or none."""
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
        sql = f"SELECT {rows.RESERVATION_COLS} FROM reservations WHERE id = :id"
        return await self._read_one(sql, {"id": reservation_id}, rows.reservation_from_row)

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
            for t, n, mb, c, rn, rmb, rc in await tx.fetchall(
                f"""SELECT t.id, t.live_sandboxes, t.live_memory_mb, t.live_cpu_m,
                      coalesce(x.n, 0), coalesce(x.mb, 0), coalesce(x.cpu_m, 0)
                    FROM tenants t LEFT JOIN (
                      SELECT tenant_id, count(*) AS n, CAST(sum(memory_mb) AS BIGINT) AS mb,
                        CAST(sum({rows.SANDBOX_CPU_M}) AS BIGINT) AS cpu_m FROM sandboxes
                      WHERE state IN {clause} GROUP BY tenant_id) x ON x.tenant_id = t.id""",
                params,
            ):
                if int(n) != int(rn) or int(mb) != int(rmb) or int(c) != int(rc):
                    problems.append(
                        f"tenant {t}: usage counters {n} / {mb} MiB / {c} mcpu, "
                        f"live sandboxes {rn} / {rmb} MiB / {rc} mcpu"
                    )
            stray = await tx.fetchone(
                "SELECT count(*) FROM reservations WHERE host_id NOT IN (SELECT id FROM hosts)"
            )
            if stray is not None and int(stray[0]):
                problems.append(f"{int(stray[0])} reservations name no known host")
            return problems

        return await self._read(run)
