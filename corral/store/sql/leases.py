"""Leases: replicas' liveness (their reservations end with them) and the leader lease."""

from __future__ import annotations

from collections.abc import Collection

from corral.store import listings
from corral.store.records import SandboxState, check_ttl
from corral.store.rows import in_list
from corral.store.sql.base import (
    SqlBase,
    Tx,
)


class LeasesSql(SqlBase):
    async def renew_replica(self, replica_id: str, ttl_s: float) -> float:
        check_ttl(ttl_s)
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

    async def live_replicas(self) -> int:
        now = self._now()

        async def run(tx: Tx) -> int:
            row = await tx.fetchone("SELECT COUNT(*) FROM replicas WHERE expires_at > :now", {"now": now})
            return int(row[0]) if row is not None else 0

        return await self._read(run)

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

    async def abandoned(self, sandbox_ids: Collection[str]) -> set[str]:
        now = self._now()

        async def run(tx: Tx) -> set[str]:
            out: set[str] = set()
            for part in listings.chunks(sandbox_ids):
                clause, params = in_list("a", part)
                got = await tx.fetchall(
                    f"SELECT s.id FROM sandboxes s WHERE s.id IN {clause} AND s.state = :reserved "
                    "AND s.owner IS NOT NULL AND NOT EXISTS "
                    "(SELECT 1 FROM replicas r WHERE r.id = s.owner AND r.expires_at > :now)",
                    {**params, "now": now, "reserved": SandboxState.RESERVED.value},
                )
                out.update(r[0] for r in got)
            return out

        return await self._read(run)

    async def try_lead(self, name: str, holder: str, ttl_s: float) -> bool:
        check_ttl(ttl_s)
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
