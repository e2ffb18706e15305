"""Failover: a dead host's sandboxes orphaned or moved, parked creates, sealed specs."""

from __future__ import annotations

from corral.core.types import HostState
from corral.store import rows
from corral.store.errors import (
    RecordNotFound,
    StateConflict,
)
from corral.store.records import (
    FailedHost,
    SandboxRecord,
)
from corral.store.sql.base import (
    SqlBase,
    Tx,
)


class FailoverSql(SqlBase):
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
                # A host declared dead holds none of its recreate-policy sandboxes any more: returning
                # before they are placed elsewhere, it is told to stop its copies (fenced one epoch
                # ahead of the record, the epoch their next placement gives them).
                await tx.execute(
                    "INSERT INTO fences (host_id, sandbox_id, epoch) "
                    "SELECT host_id, id, epoch + 1 FROM sandboxes WHERE host_id = :h AND state = 'recreating' "
                    "ON CONFLICT (host_id, sandbox_id) DO UPDATE SET epoch = excluded.epoch",
                    {"h": host_id},
                )
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
