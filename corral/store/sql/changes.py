"""The change feed (migration 17): read and pruned here; written only by the tables' triggers. How a
replica learns that something committed is the backend's (``on_change``)."""

from __future__ import annotations

from corral.store import rows
from corral.store.records import ChangeRecord, SandboxRecord
from corral.store.sql.base import SqlBase, Tx

_COLS = "version, kind, key, tenant_id, name, deleted"


class ChangesSql(SqlBase):
    async def changes_since(self, version: int, *, limit: int = 1000) -> list[ChangeRecord]:
        async def run(tx: Tx) -> list[ChangeRecord]:
            found = await tx.fetchall(
                f"SELECT {_COLS} FROM changes WHERE version > :v ORDER BY version LIMIT :n",
                {"v": version, "n": max(1, limit)},
            )
            return [ChangeRecord(int(r[0]), r[1], r[2], r[3], r[4], bool(r[5])) for r in found]

        return await self._read(run)

    async def change_bounds(self) -> tuple[int, int]:
        async def run(tx: Tx) -> tuple[int, int]:
            latest = await tx.fetchone("SELECT version FROM changes_seq")
            oldest = await tx.fetchone("SELECT min(version) FROM changes")
            last = int(latest[0]) if latest is not None else 0
            return (int(oldest[0]) - 1 if oldest is not None and oldest[0] is not None else last), last

        return await self._read(run)

    async def prune_changes(self, keep: int) -> int:
        async def run(tx: Tx) -> int:
            return await tx.execute(
                "DELETE FROM changes WHERE version <= (SELECT version FROM changes_seq) - :keep",
                {"keep": max(0, keep)},
            )

        return await self._write(run)

    async def get_sandbox_by_name(self, tenant_id: str, name: str) -> SandboxRecord | None:
        async def run(tx: Tx) -> SandboxRecord | None:
            row = await tx.fetchone(
                f"SELECT {rows.SANDBOX_COLS} FROM sandboxes WHERE tenant_id = :t AND name = :n "
                "AND name IS NOT NULL AND state <> 'deleted'",
                {"t": tenant_id, "n": name},
            )
            return rows.sandbox_from_row(row) if row is not None else None

        return await self._read(run)
