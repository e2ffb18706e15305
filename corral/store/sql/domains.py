"""Custom domains bound to sandboxes' ports: the hostname is the table's primary key, so two binds
of one name in two replicas' transactions cannot both commit (the second is refused, DomainTaken)."""

from __future__ import annotations

from corral.store.errors import DomainTaken, RecordNotFound
from corral.store.records import LIVE_STATES, DomainRecord
from corral.store.rows import Row, in_list
from corral.store.sql.base import SqlBase, Tx

_COLS = "hostname, sandbox_id, tenant_id, port, created_at"


def _domain(row: Row) -> DomainRecord:
    return DomainRecord(str(row[0]), str(row[1]), str(row[2]), int(row[3]), float(row[4]))


class DomainsSql(SqlBase):
    async def bind_domain(self, hostname: str, sandbox_id: str, port: int) -> DomainRecord:
        if not 1 <= port <= 65535:
            raise ValueError(f"port {port} is not in 1..65535")
        now = self._now()
        live, params = in_list("s", sorted(s.value for s in LIVE_STATES))

        async def run(tx: Tx) -> DomainRecord:
            owner = await tx.fetchone(
                f"SELECT tenant_id FROM sandboxes WHERE id = :id AND state IN {live}",
                {"id": sandbox_id, **params},
            )
            if owner is None:
                raise RecordNotFound(f"no live sandbox {sandbox_id}")
            # A holder that is gone (or whose record is) gives the name up to whoever binds it next.
            await tx.execute(
                "DELETE FROM sandbox_domains WHERE hostname = :h AND sandbox_id <> :id AND NOT EXISTS "
                f"(SELECT 1 FROM sandboxes s WHERE s.id = sandbox_domains.sandbox_id AND s.state IN {live})",
                {"h": hostname, "id": sandbox_id, **params},
            )
            await tx.execute(
                "UPDATE sandbox_domains SET port = :p WHERE hostname = :h AND sandbox_id = :id",
                {"h": hostname, "id": sandbox_id, "p": port},
            )
            row = await tx.fetchone(
                f"SELECT {_COLS} FROM sandbox_domains WHERE hostname = :h", {"h": hostname}
            )
            if row is None:
                record = DomainRecord(hostname, sandbox_id, str(owner[0]), port, now)
                await tx.execute(
                    f"INSERT INTO sandbox_domains ({_COLS}) VALUES (:h, :id, :t, :p, :now)",
                    {"h": hostname, "id": sandbox_id, "t": record.tenant_id, "p": port, "now": now},
                )
                return record
            found = _domain(row)
            if found.sandbox_id != sandbox_id:
                raise DomainTaken(f"{hostname} is bound to another sandbox")
            return found

        try:
            return await self._write(run)
        except Exception as exc:
            if self._is_unique_violation(exc):  # a concurrent bind of the same name committed first
                raise DomainTaken(f"{hostname} is bound to another sandbox") from exc
            raise

    async def get_domain(self, hostname: str) -> DomainRecord | None:
        return await self._read_one(
            f"SELECT {_COLS} FROM sandbox_domains WHERE hostname = :h", {"h": hostname}, _domain
        )

    async def list_domains(self, sandbox_id: str) -> list[DomainRecord]:
        async def run(tx: Tx) -> list[DomainRecord]:
            got = await tx.fetchall(
                f"SELECT {_COLS} FROM sandbox_domains WHERE sandbox_id = :id ORDER BY hostname",
                {"id": sandbox_id},
            )
            return [_domain(r) for r in got]

        return await self._read(run)

    async def unbind_domain(self, hostname: str, sandbox_id: str) -> bool:
        async def run(tx: Tx) -> bool:
            n = await tx.execute(
                "DELETE FROM sandbox_domains WHERE hostname = :h AND sandbox_id = :id",
                {"h": hostname, "id": sandbox_id},
            )
            return n > 0

        return await self._write(run)
